"""A study's models in worker processes: each worker takes one model and runs its jobs in
plan order, then takes the next model whose base (a job's `base`, say a fine-tune's) has
finished its first job (its training).

    resolve_workers(value, backend=, cores=) -> int    config.workers as a count
    run_models(study, plan, todo, workers=, seconds=, on_job=, on_model=, stop=)

Why: the study's CPU models are small (L = 64, E = 64), and XLA:CPU's thread pool does not
keep two cores busy on them: one training uses about 1.6 of a 2-core host's cores, a quarter
of it in the kernel. Two trainings pinned to one core each finished in 39 s where the same
two, one after the other, took 58 s (2026-12-01, 2-core host). On an accelerator the device
is the limit, and a second process would have to share its memory: one worker there.

Each worker is a fresh interpreter (multiprocessing's "spawn": a process that has started JAX
cannot fork) pinned to its share of the cores before JAX starts. It rebuilds the plan from the
same config (`study.plan` is pure; the study record is pickled, so its parts are module-level
functions) and runs the study's runners on the jobs of the model it is sent, storing each
result as in one process (`resume.execute`). Each model owns its directory and its result
files, so the parent only schedules and counts; it reads the results back at the end.

Faults: SIGTERM or Ctrl-C to the parent (`signals.Stop`) is passed to every busy worker as
SIGTERM, whose training saves a checkpoint (as in one process); the parent then exits 0 and a
rerun resumes. A worker ended by SIGTERM outside a training (SIGTERM to the whole process group
while it evaluates) is a stop too, not a fault. A parent killed outright (SIGKILL) leaves no
orphan: each worker sends itself SIGTERM when its parent dies (a training saves its
checkpoint), takes no further job or model, and ends itself `ORPHAN_GRACE_S` later whatever it
is doing (a SIGTERM that a training's handler absorbed after its last step check once left a
worker waiting on its own inbox for good). A worker's exception, or a worker that dies (out of
memory), stops the others the same way and is raised here as RuntimeError naming the model,
with the worker's traceback.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

from posenc_jax import checks
from train.engine import resume
from train.engine.store import Store

POLL_S = 0.5       # how often the parent checks that its busy workers are alive
JOIN_S = 120.0     # how long a stopping worker may take to save its checkpoint
SPEEDUP_PER_WORKER = 0.74   # measured: see `speedup`
AUTO_MAX = 8       # config.workers=0 on a many-core CPU: at most this many processes
ORPHAN_GRACE_S = 10.0   # a worker whose parent died ends itself this long after its SIGTERM
EXIT_ORPHANED = 75      # its exit status then (EX_TEMPFAIL: rerun the study to resume)


def resolve_workers(value, *, backend: str, cores: int) -> int:
    """`config.workers` as a count: 0 (auto) is one per CPU core on the CPU backend, at most
    `AUTO_MAX` (each worker is a JAX process of about 1 GiB), and 1 on an accelerator."""
    n = checks.integer("config.workers", value, minimum=0)
    if n:
        return n
    return max(1, min(cores, AUTO_MAX)) if backend == "cpu" else 1


def speedup(workers: int) -> float:
    """Expected speed of `workers` processes over one, for the printed estimate: 0.74 per
    worker (2 workers on 2 cores: the default study in 778 s against 1,147 s in one)."""
    return max(1.0, SPEEDUP_PER_WORKER * workers)


def cpu_cores() -> list[int]:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_shares(cores: Sequence[int], workers: int) -> list[list[int]]:
    """Disjoint core sets, one per worker; no pinning ([] each) when cores < workers."""
    if workers > len(cores):
        return [[] for _ in range(workers)]
    return [list(cores[i::workers]) for i in range(workers)]


def models_to_do(plan, todo: Sequence) -> list[str]:
    """The models with work left, in plan order."""
    left = {job.model for job in todo}
    return list(dict.fromkeys(j.model for j in plan.jobs if j.model in left))


def schedule(plan, todo: Sequence, *, seconds: Mapping
             ) -> tuple[dict[str, str], dict[str, float]]:
    """(base of each model that has one, estimated `seconds` of each model's `todo` jobs and
    its dependents')."""
    bases = {j.model: j.base for j in plan.jobs if getattr(j, "base", None)}
    cost = {m: 0.0 for m in dict.fromkeys(j.model for j in plan.jobs)}
    for job in todo:
        cost[job.model] += float(seconds.get(job, 0.0))
    total = dict(cost)
    for model, base in bases.items():
        total[base] += cost[model]
    return bases, total


def next_model(pending: Sequence[str], *, ready: Callable[[str], bool],
               cost: dict[str, float]) -> str | None:
    """The costliest pending model that can start (the longest first finishes soonest)."""
    candidates = [m for m in pending if ready(m)]
    return max(candidates, key=lambda m: cost[m]) if candidates else None


def _exit_with_parent(gone: threading.Event, *, grace_s: float = ORPHAN_GRACE_S) -> None:
    """When this process's parent dies without stopping it (SIGKILL, out of memory): sets
    `gone`, sends this process SIGTERM (a training saves its checkpoint and exits, an idle
    worker exits), and `grace_s` later ends the process outright, whatever caught the SIGTERM:
    none is left orphaned, waiting for a model forever or training beside a rerun."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        gone.set()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(EXIT_ORPHANED)  # a handler absorbed the SIGTERM: nobody is left to serve

    threading.Thread(target=watch, name="engine-parent-watch", daemon=True).start()


def _next_model(inbox, gone: threading.Event) -> str | None:
    """The next model from `inbox`, None to stop: sent by the parent, or the parent is gone
    (the worker holds the inbox's write end too, so a dead parent never closes it)."""
    while not gone.is_set():
        try:
            return inbox.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None


def serve(inbox, outbox, run_job: Callable, jobs_for: Callable, gone: threading.Event) -> None:
    """The worker's loop: for each model from `inbox`, `run_job` on each of `jobs_for(model)`,
    a ("job", job, text) message per job and ("model", model, "") at the end; returns at None
    or once the parent is gone (raising SystemExit if a job had started by then)."""
    while (model := _next_model(inbox, gone)) is not None:
        for job in jobs_for(model):
            if gone.is_set():
                raise SystemExit(0)
            outbox.put(("job", *run_job(job)))
        outbox.put(("model", model, ""))


def _worker(study, config, workdir: str, cores: list[int], inbox, outbox) -> None:
    """A worker's life: pin, rebuild the plan, run the models it is sent until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    gone = threading.Event()
    _exit_with_parent(gone)
    if cores:
        os.sched_setaffinity(0, cores)
    model = None
    try:
        plan = study.plan(config, workdir)
        ctx = study.prepare(plan) if study.prepare else plan
        store = Store(plan.workdir, study.results_dir)
        index = {job: i for i, job in enumerate(plan.jobs)}

        def run_job(job):
            nonlocal model
            model = job.model
            result = resume.found(study, ctx, store, [job]).get(job)
            if result is None:
                result = resume.execute(study, ctx, store, job)
            return index[job], resume.describe(study, job, result)

        def jobs_for(name: str) -> list:
            return [job for job in plan.jobs if job.model == name]

        serve(inbox, outbox, run_job, jobs_for, gone)
    except SystemExit:   # a training saved its checkpoint on SIGTERM
        outbox.put(("stopped", model, ""))
    except BaseException:  # noqa: BLE001 -- reported to the parent, which raises it
        outbox.put(("error", model, traceback.format_exc()))


class _Workers:
    """The spawned worker processes, their inboxes and what each is busy with."""

    def __init__(self, study, plan, workers: int):
        spawn = multiprocessing.get_context("spawn")
        self.outbox = spawn.Queue()
        self.inboxes, self.procs, self.busy = [], [], {}
        for i, cores in enumerate(core_shares(cpu_cores(), workers)):
            inbox = spawn.Queue()
            proc = spawn.Process(target=_worker, name=f"{study.name}-worker-{i}", daemon=True,
                                 args=(study, plan.config, plan.workdir, cores, inbox,
                                       self.outbox))
            proc.start()
            self.inboxes.append(inbox)
            self.procs.append(proc)

    def idle(self) -> list[int]:
        return [i for i in range(len(self.procs)) if i not in self.busy]

    def send(self, i: int, model: str) -> None:
        self.busy[i] = model
        self.inboxes[i].put(model)

    def dead(self) -> tuple[str, int] | None:
        """(what a worker that died without a word was doing, its exit code), else None."""
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():
                doing = (f"running model {self.busy[i]!r}" if i in self.busy
                         else "waiting for a model")
                return doing, proc.exitcode
        return None

    def stop(self) -> None:
        """SIGTERM to the busy workers (a training saves its checkpoint), None to the idle
        ones; waits for all, then kills what is left."""
        for i, proc in enumerate(self.procs):
            if i in self.busy and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
            else:
                self.inboxes[i].put(None)
        for proc in self.procs:
            proc.join(JOIN_S)
            if proc.is_alive():
                proc.kill()
                proc.join()


def run_models(study, plan, todo: Sequence, *, workers: int, seconds: Mapping,
               on_job: Callable, on_model: Callable[[str], None], stop) -> None:
    """Runs the `todo` jobs of `plan` in `workers` processes (see the module docstring).
    `on_job(job, text)` is called as each job finishes, `on_model(model)` as each model's
    last one does. Raises SystemExit(0) once `stop.asked` (a `signals.Stop`)."""
    pending = models_to_do(plan, todo)
    bases, cost = schedule(plan, todo, seconds=seconds)
    firsts, todo_set = {}, set(todo)
    for job in plan.jobs:
        firsts.setdefault(job.model, job)
    left = {m for m, job in firsts.items() if job in todo_set}  # first jobs not finished

    def ready(model: str) -> bool:
        return bases.get(model) not in left

    pool = _Workers(study, plan, workers)
    try:
        while pending or pool.busy:
            if stop.asked:
                raise SystemExit(0)
            for i in pool.idle():
                model = next_model(pending, ready=ready, cost=cost)
                if model is None:
                    break
                pending.remove(model)
                pool.send(i, model)
            if not pool.busy:
                raise RuntimeError(f"{study.name}: models {pending} wait for bases that "
                                   "never finished training")
            _receive(study.name, plan, pool, (left, firsts), on_job, on_model)
    except BaseException as error:
        pool.stop()
        if stop.asked or isinstance(error, SystemExit):
            print(f"{study.name}: stopped by SIGTERM or Ctrl-C (each training saved a "
                  "checkpoint); rerun the same command to resume", flush=True)
        raise
    else:
        pool.stop()


def _receive(name: str, plan, pool: _Workers, firsts, on_job, on_model) -> None:
    """Handles one message from the workers (or checks that the busy ones are alive)."""
    left, first = firsts
    try:
        kind, key, text = pool.outbox.get(timeout=POLL_S)
    except queue.Empty:
        dead = pool.dead()
        if dead and dead[1] == -signal.SIGTERM:  # outside a training: a stop, not a fault
            raise SystemExit(0) from None        # (SIGTERM to the process group, say)
        if dead:
            raise RuntimeError(f"{name}: the worker {dead[0]} died (exit code {dead[1]}; out "
                               "of memory?); rerun to resume") from None
        return
    if kind == "job":
        job = plan.jobs[key]
        if first[job.model] == job:
            left.discard(job.model)
        on_job(job, text)
    elif kind == "model":
        pool.busy = {i: m for i, m in pool.busy.items() if m != key}
        on_model(key)
    elif kind == "stopped":
        raise SystemExit(0)
    else:
        raise RuntimeError(f"{name}: a worker failed on model {key!r}:\n{text}")

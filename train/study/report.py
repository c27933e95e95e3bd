"""The study's report: every output file and every line of text it shows.

    write_all(plan, workdir, rows=..., results=..., invocation=..., corpus=...)
        results.csv, report.md, extrapolation.png and timings.json (names: `files`)
    write_results(workdir, rows)   results.csv alone (the runner saves partial results)
    summary(plan, todo), describe(job, result)   the console lines

    python -m train.study.report --a=runs/study --b=runs/study_seed1   # seed-to-seed noise
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import jax
from absl import flags

from posenc_jax.model.config import thaw
from train.study import files, table
from train.study.jobs import NO_SCALING, EvalJob, Job, TrainJob
from train.study.plan import Plan
from train.study.plot import plot


def summary(plan: Plan, todo: Sequence[Job]) -> str:
    """One line: what the plan holds, what is left to do, the estimated time."""
    trains = [j for j in todo if j.kind == TrainJob.kind]
    evals = [j for j in todo if j.kind == EvalJob.kind]
    est = sum(plan.estimate(j) for j in todo)
    return (f"study: {len(plan.encodings)} encodings ({', '.join(plan.encodings)}), "
            f"L={plan.train_len}, eval lengths {list(plan.eval_lens)}, scalings "
            f"{list(plan.scalings) or 'none'}; to do: {len(trains)} trainings, {len(evals)} "
            f"evaluations (reused: {len(plan.of_kind(TrainJob.kind)) - len(trains)} trainings, "
            f"{len(plan.of_kind(EvalJob.kind)) - len(evals)} evaluations); estimated "
            f"{est / 60:.1f} min at {plan.config.estimate_gflops} GFLOP/s "
            f"(config.estimate_gflops) -- an estimate, not a measurement")


def describe(job: Job, result: Any) -> str:
    """A few words on a finished job, for the progress bar."""
    if job.kind == EvalJob.kind:
        return f"{table.label(job.encoding, job.scaling)}@{job.eval_len} ppl={result['ppl']:.3f}"
    return f"{job.kind} {job.model}"


def machine() -> str:
    """CPU model and cores, load, Python/JAX/Flax versions and devices, as markdown lines."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    devices = jax.devices()
    return "\n".join([
        (f"- CPU: {cpu}, {os.cpu_count()} logical cores; load average (1, 5, 15 min) at "
         f"report time: {load}"),
        f"- {platform.platform()}, Python {platform.python_version()}",
        (f"- jax {jax.__version__}, flax {flax.__version__}; {len(devices)} device(s): "
         f"{devices[0].platform} ({devices[0].device_kind})")])


def _timing_table(plan: Plan, results: Mapping[Job, Any], timings: dict) -> str:
    lines = ["| encoding | train (s) | eval (s) |", "|---|---|---|"]
    for job in plan.of_kind(TrainJob.kind):
        train_s = (results.get(job) or {}).get("train_seconds")
        eval_s = sum(float(results[j].get("eval_seconds", 0.0)) for j in plan.jobs_for(job.model)
                     if j.kind == EvalJob.kind and j in results)
        lines.append(f"| `{job.model}` | {'?' if train_s is None else f'{train_s:.0f}'} | "
                     f"{eval_s:.0f} |")
    lines += ["", ("Invocations of the study in this workdir (wall time includes data "
                   "preparation and compilation, about 2-3 s per evaluation here; the estimate "
                   "is `config.estimate_gflops`'s):"), ""]
    for i, run_ in enumerate(timings["invocations"], 1):
        load = ", ".join(f"{x:.2f}" for x in run_["load_at_start"])
        lines.append(f"{i}. {run_['started']}: {run_['work_items']} work items in "
                     f"{run_['wall_s']:.0f} s (estimated {run_['estimate_s']:.0f} s); load "
                     f"average (1, 5, 15 min) at the start {load}")
    return "\n".join(lines)


def _scaled_dicts(plan: Plan) -> list[str]:
    scaled = [j for j in plan.of_kind(EvalJob.kind) if j.scaling != NO_SCALING]
    if not scaled:
        return []
    n = max(j.eval_len for j in scaled)
    out = [f"- Scaling dicts at eval length {n}:"]
    for job in (j for j in scaled if j.eval_len == n):
        sc = thaw(job.overrides)["encoding_kwargs"]["scaling"]
        for key in ("short_factor", "long_factor"):
            if key in sc:
                sc[key] = "[" + ", ".join(f"{v:.3g}" for v in sc[key]) + "]"
        out.append(f"  - `{job.scaling}`: {sc}")
    return out


def _method_notes(plan: Plan) -> str:
    first = plan.train_configs[plan.models[0]]
    kwargs = "; ".join(f"`{m}` {c.model.encoding_kwargs.to_dict() or '{}'}"
                       for m, c in plan.train_configs.items())
    lines = [
        (f"- Every model: the same `config.train` (data order, init seed {first.seed}, "
         f"{first.num_train_steps} steps of {first.batch_size} x {first.seq_len} tokens), only "
         f"the encoding differs. Encoding kwargs: {kwargs}."),
        (f"- Evaluation: the first {plan.eval_num_tokens} targets of the "
         f"`{plan.config.eval_split}` split, scored in non-overlapping windows of each length "
         "(the same tokens for every length and encoding). Each window starts without "
         "context, so longer windows give the average token more context (as in Press et al. "
         "2022's non-overlapping evaluation)."),
        ("- RoPE scaling: zero-shot (no fine-tuning), factor s = eval_len / L, rebuilt with "
         "the trained params. See `train.study.scalings.scaling_config` for every parameter; "
         "`dynamic` follows Hugging Face (the base grows as (s * len / L - (s - 1))^(d/(d-2)), "
         "so over a whole window of s * L it is NTK with factor s^2 - s + 1); `longrope` uses "
         "no search: NTK-aware per-dimension factors plus LongRoPE's attention factor.")]
    return "\n".join(lines + _scaled_dicts(plan))


def config_lines(config, prefix: str = "") -> list[str]:
    """A ConfigDict as `key = value` lines, the form of `--config.key=value` overrides."""
    out = []
    for key in sorted(config.keys()):
        value = config[key]
        if hasattr(value, "keys") and hasattr(value, "to_dict"):
            sub = config_lines(value, f"{prefix}{key}.")
            out += sub or [f"{prefix}{key} = {{}}"]
        else:
            out.append(f"{prefix}{key} = {value!r}")
    return out


def markdown(rows: Sequence[Mapping[str, Any]], *, train_len: int, order: Sequence[str],
             sections: Mapping[str, str]) -> str:
    """The whole report.md: the ppl table, the figure, a loss table, notes, then `sections`."""
    parts = [f"# Length-extrapolation study (trained at L = {train_len})", "",
             ("Perplexity per byte on held-out windows (lower is better); columns are the "
              "evaluation lengths, `—` not evaluated, `n/a` cannot be evaluated (see notes)."),
             "",
             table.table(rows, train_len=train_len, order=order), "",
             f"![perplexity against evaluation length]({files.PLOT})", "",
             "Loss (nats per byte):", "",
             table.table(rows, train_len=train_len, order=order, key="loss", fmt="{:.4f}"), ""]
    row_notes = table.notes(rows)
    if row_notes:
        parts += ["Notes:", ""] + [f"- {n}" for n in row_notes] + [""]
    for name, text in sections.items():
        parts += [f"## {name}", "", text.rstrip(), ""]
    return "\n".join(parts)


def write_results(workdir: files.Workdir, rows: Sequence[Mapping[str, Any]]) -> None:
    files.write_text(workdir.results, table.csv_text(rows))


def write_all(plan: Plan, workdir: files.Workdir, *, rows: Sequence[Mapping[str, Any]],
              results: Mapping[Job, Any], invocation: dict, corpus: dict) -> None:
    """Appends `invocation` to timings.json, then writes results.csv, the plot, report.md."""
    timings = files.read_json(workdir.timings) or {"invocations": []}
    timings["invocations"].append(invocation)
    files.write_json(workdir.timings, timings)
    write_results(workdir, rows)
    order = list(plan.encodings)
    plot(workdir.plot, rows, train_len=plan.train_len, order=order)
    corpus_text = json.dumps(corpus, indent=1, sort_keys=True, default=str)
    sections = {
        "How it was measured": _method_notes(plan),
        "Timings": _timing_table(plan, results, timings),
        "Machine": machine(),
        "Corpus": f"```json\n{corpus_text}\n```",
        "Study configuration": "```\n" + "\n".join(config_lines(plan.config)) + "\n```",
    }
    files.write_text(workdir.report, markdown(rows, train_len=plan.train_len, order=order,
                                              sections=sections))


def main(argv: Sequence[str]) -> None:
    del argv
    a = files.Workdir(flags.FLAGS.a).results
    b = files.Workdir(flags.FLAGS.b).results
    print(table.noise(table.read_csv(a), table.read_csv(b)))


if __name__ == "__main__":
    from absl import app

    flags.DEFINE_string("a", None, "a study workdir", required=True)
    flags.DEFINE_string("b", None, "another study workdir (e.g. another seed)", required=True)
    app.run(main)

"""The length-extrapolation study: train one model per encoding at length L, evaluate each at
L/2 ... 16L, and RoPE zero-shot with every scaling method past L.

    python -m train.study --config=configs/study.py --workdir=runs/study
    python -m train.study --config=configs/study.py --workdir=runs/study \\
        --config.encodings=rope,alibi --config.train.seed=1

Every model is trained from the same `config.train` (same data order, init seed, steps,
optimizer); only `model.encoding` and its kwargs differ. Each lives in `workdir/<encoding>/`
and is trained by `train.trainer.train_and_evaluate`, so an interrupted training resumes from
its checkpoint and a finished one (checkpoint at the final step) is not trained again. Each
finished evaluation is a JSON file in `workdir/evals/`, reused on a rerun. Outputs:
`workdir/results.csv`, `workdir/report.md`, `workdir/extrapolation.png` (`train.study_report`).

Evaluation: the first `eval_num_tokens` targets of `eval_split`, scored in non-overlapping
windows of each length (`data.eval_batches`: the same tokens for every length and encoding;
each window starts without context). The RoPE model is re-built with a scaled encoding and
the same params (RoPE has none, so the param tree is identical), with factor s = eval_len / L
(see `scaling_config`). The learned table cannot encode positions >= its max_len (L by
default): those rows are written as n/a, not dropped.

Everything is checked before the first training step (`make_plan`): encoding and scaling
names, eval lengths (positive ints, at least one full window in eval_num_tokens, within the
eval memory budget), every model config and scaled encoding, and that existing trainings in
the workdir were made with the same config.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from train import study_plan, study_report
from train.study_plan import Plan, make_plan

TRAIN_MARKER = study_plan.MARKER


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def train_done(plan: Plan, encoding: str) -> bool:
    """True when `workdir/<encoding>` holds a finished training of this plan's config."""
    from train import checkpoint

    marker = _read_json(os.path.join(plan.model_dir(encoding), TRAIN_MARKER))
    if not marker or marker.get("fingerprint") != plan.fingerprints[encoding]:
        return False
    directory = os.path.join(plan.model_dir(encoding), checkpoint.CHECKPOINT_DIR)
    if not os.path.isdir(directory):
        return False
    ckpt = checkpoint.Checkpointer(directory, async_save=False)
    try:
        return ckpt.latest_step() == plan.train_configs[encoding].num_train_steps
    finally:
        ckpt.close()


def _train(plan: Plan, encoding: str) -> float:
    from train import trainer

    workdir = plan.model_dir(encoding)
    os.makedirs(workdir, exist_ok=True)
    marker_path = os.path.join(workdir, TRAIN_MARKER)
    marker = _read_json(marker_path) or {"train_seconds": 0.0}
    _write_json(marker_path, {**marker, "fingerprint": plan.fingerprints[encoding],
                              "finished": False})
    start = time.perf_counter()
    result = trainer.train_and_evaluate(plan.train_configs[encoding], workdir)
    seconds = time.perf_counter() - start
    if result.get("preempted"):  # SIGTERM: the trainer saved a checkpoint; exit 0 like it
        print(f"study: training {encoding!r} was preempted at step {result['step']} (checkpoint "
              "saved); rerun the same command to resume", flush=True)
        raise SystemExit(0)
    _write_json(marker_path, {
        **marker, "fingerprint": plan.fingerprints[encoding], "finished": True,
        "train_seconds": marker.get("train_seconds", 0.0) + seconds,
        "final_loss": result.get("loss"), "step": result.get("step")})
    return seconds


class _Evaluator:
    """Restores one trained model and evaluates it with any encoding kwargs and length."""

    def __init__(self, plan: Plan, encoding: str):
        from train import evaluation, sharding

        self.plan, self.encoding = plan, encoding
        self.config = plan.train_configs[encoding]
        self.mesh = sharding.make_mesh(self.config.mesh)
        _, self.params, _ = evaluation.load_params(
            plan.model_dir(encoding), step=self.config.num_train_steps, mesh=self.mesh,
            config=self.config)

    def __call__(self, item: study_plan.EvalItem) -> dict:
        from train import state, trainer

        overrides = self.plan.model_overrides(item)
        setup = state.make_setup(self.config, self.mesh, model_overrides=overrides)
        return trainer.evaluate_params(
            setup.graphdef, self.params, self.plan.eval_stream, seq_len=item.eval_len,
            num_tokens=self.plan.eval_num_tokens, batch_size=self.plan.eval_batch(item.eval_len),
            mesh=self.mesh, rules=setup.rules, packed=self.config.dataset.packed)


def _eval_row(plan: Plan, item: study_plan.EvalItem, evaluator) -> dict:
    row = {"encoding": item.encoding, "scaling": item.scaling, "train_len": plan.train_len,
           "eval_len": item.eval_len, "fingerprint": plan.eval_fingerprint(item)}
    if item.note:  # cannot be evaluated (the learned table past its length)
        return {**row, "loss": float("nan"), "ppl": float("nan"), "tokens": 0,
                "eval_seconds": 0.0, "note": item.note}
    start = time.perf_counter()
    result = evaluator(item)
    return {**row, "loss": result["loss"], "ppl": result["ppl"], "tokens": result["tokens"],
            "eval_seconds": time.perf_counter() - start, "note": ""}


def run(config, workdir: str, *, progress: bool = True) -> list[dict]:
    """Runs (or resumes) the whole study; returns the result rows. See the module docstring.

    Raises ValueError before any training for anything `make_plan` rejects.
    """
    import tqdm

    wall_start = time.perf_counter()
    plan = make_plan(config, workdir)
    os.makedirs(plan.evals_dir, exist_ok=True)
    timings = _read_json(plan.timings_path) or {"invocations": []}
    rows = {}
    for item in plan.eval_items:
        cached = _read_json(plan.eval_path(item))
        if cached and cached.get("fingerprint") == plan.eval_fingerprint(item):
            rows[item] = cached
    trained = {enc: train_done(plan, enc) for enc in plan.encodings}
    todo = [("train", enc) for enc in plan.encodings if not trained[enc]]
    todo += [("eval", item) for item in plan.eval_items if item not in rows]
    print(plan.summary(todo), flush=True)
    estimate = sum(plan.estimate(w) for w in todo)
    this = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "work_items": len(todo),
            "estimate_s": estimate, "load_at_start": list(os.getloadavg())}
    bar = tqdm.tqdm(total=round(estimate), unit="s(est)",
                    disable=not progress, dynamic_ncols=True, position=0,
                    bar_format="study {percentage:3.0f}%|{bar}| {postfix} "
                               "[{elapsed}<{remaining}]")
    done_items = 0

    def advance(work, what: str) -> None:
        nonlocal done_items
        done_items += 1
        bar.set_postfix_str(f"{done_items}/{len(todo)} items, last: {what}", refresh=False)
        bar.update(round(plan.estimate(work)))

    try:
        for encoding in plan.encodings:
            if not trained[encoding]:
                _train(plan, encoding)
                advance(("train", encoding), f"trained {encoding}")
            evaluator = None
            for item in plan.items_for(encoding):
                if item in rows:
                    continue
                if evaluator is None and not item.note:
                    evaluator = _Evaluator(plan, encoding)
                row = _eval_row(plan, item, evaluator)
                _write_json(plan.eval_path(item), row)
                rows[item] = row
                advance(("eval", item), f"{study_report.label(encoding, item.scaling)}"
                                        f"@{item.eval_len} ppl={row['ppl']:.3f}")
            study_report.write_csv(plan.results_path, rows.values())
    finally:
        bar.close()
    out = [rows[item] for item in plan.eval_items]
    this["wall_s"] = time.perf_counter() - wall_start
    timings["invocations"].append(this)
    _write_json(plan.timings_path, timings)
    study_report.write_csv(plan.results_path, out)
    write_report(plan, out, timings)
    print(f"study: wrote {plan.results_path}, {plan.report_path}, {plan.plot_path} "
          f"({this['wall_s']:.0f} s this run)", flush=True)
    return out


def machine() -> str:
    """CPU model and cores, load, Python/JAX/Flax versions and devices, as markdown lines."""
    import platform

    import flax
    import jax

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


def _timing_table(plan: Plan, timings: dict) -> str:
    lines = ["| encoding | train (s) | eval (s) |", "|---|---|---|"]
    for enc in plan.encodings:
        marker = _read_json(os.path.join(plan.model_dir(enc), TRAIN_MARKER)) or {}
        train_s = marker.get("train_seconds")
        eval_s = sum(float(r.get("eval_seconds", 0.0)) for r in
                     (_read_json(plan.eval_path(i)) or {} for i in plan.items_for(enc)))
        lines.append(f"| `{enc}` | {'?' if train_s is None else f'{train_s:.0f}'} | "
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


def _method_notes(plan: Plan) -> str:
    first = plan.train_configs[plan.encodings[0]]
    kwargs = "; ".join(f"`{e}` {plan.train_configs[e].model.encoding_kwargs.to_dict() or '{}'}"
                       for e in plan.encodings)
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
         "the trained params. See `train.study_plan.scaling_config` for every parameter; "
         "`dynamic` follows Hugging Face (the base grows as (s * len / L - (s - 1))^(d/(d-2)), "
         "so over a whole window of s * L it is NTK with factor s^2 - s + 1); `longrope` uses "
         "no search: NTK-aware per-dimension factors plus LongRoPE's attention factor.")]
    if plan.scalings and "rope" in plan.encodings:
        n = max(k[1] for k in plan.scaled_kwargs)
        lines.append(f"- Scaling dicts at eval length {n}:")
        for method in plan.scalings:
            sc = dict(plan.scaled_kwargs[(method, n)]["scaling"])
            for key in ("short_factor", "long_factor"):
                if key in sc:
                    sc[key] = "[" + ", ".join(f"{v:.3g}" for v in sc[key]) + "]"
            lines.append(f"  - `{method}`: {sc}")
    return "\n".join(lines)


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


def write_report(plan: Plan, rows: list[dict], timings: dict) -> None:
    """Writes report.md and extrapolation.png from the rows."""
    order = list(plan.encodings)
    study_report.plot(plan.plot_path, rows, train_len=plan.train_len, order=order)
    corpus = json.dumps(plan.corpus, indent=1, sort_keys=True, default=str)
    sections = {
        "How it was measured": _method_notes(plan),
        "Timings": _timing_table(plan, timings),
        "Machine": machine(),
        "Corpus": f"```json\n{corpus}\n```",
        "Study configuration": "```\n" + "\n".join(config_lines(plan.config)) + "\n```",
    }
    text = study_report.markdown(rows, train_len=plan.train_len, order=order, sections=sections)
    text = text.replace("\n\nLoss", "\n\n![perplexity against evaluation length]"
                        "(extrapolation.png)\n\nLoss", 1)
    study_report.write_text(plan.report_path, text)


def main(argv: Sequence[str]) -> None:
    from absl import flags, logging

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save and restore at INFO
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments {argv[1:]}")
    run(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "a study config (configs/study.py)",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "where models, evaluations and the report go")
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)

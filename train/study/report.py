"""The study's report: every output file and every line of text it shows.

    write_all(ctx, results, timings) -> [paths]   the study record's `report`: results.csv,
        passkey.csv, report.md, extrapolation.png, passkey.png (timings.json: the engine's)
    write_partial(ctx, results)                  the CSVs alone (partial results, mid-run)
    estimate(ctx, todo, workers), summary(plan, todo), describe(job, result)
                                                 the estimate and the console lines

    python -m train.study.report --a=runs/study --b=runs/study_seed1   # seed-to-seed noise
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from posenc_jax.model.config import thaw
from train.engine import record, workers
from train.engine.output import machine
from train.engine.scalings import NO_SCALING
from train.engine.store import write_text
from train.study import aggregate, entries, extension, figures, files, searched, table
from train.study.jobs import EvalJob, FinetuneJob, Job, PasskeyJob, TrainJob
from train.study.plan import Plan


def summary(plan: Plan, todo: Sequence[Job], *, workers: int = 1, speedup: float = 1.0
            ) -> str:
    """One line: what the plan holds, what is left to do, the estimated time (one process's,
    divided by `speedup` for `workers` processes)."""
    kinds = ("train", "finetune", "eval", "passkey", searched.SearchJob.kind)
    left = {k: sum(1 for j in todo if j.kind == k) for k in kinds}
    total = {k: len(plan.of_kind(k)) for k in kinds}
    est = sum(plan.estimate(j) for j in todo) / speedup
    counts = ", ".join(f"{left[k]}/{total[k]} {k}" for k in kinds if total[k])
    how = f" with {workers} worker processes" if workers > 1 else ""
    return (f"study: {len(plan.encodings)} encodings ({', '.join(plan.encodings)}), "
            f"seeds {list(plan.seeds)}, L={plan.train_len}, eval lengths "
            f"{list(plan.eval_lens)}, scalings {list(plan.scalings) or 'none'}; to do "
            f"(of all): {counts}; estimated {est / 60:.1f} min{how} at "
            f"{plan.config.estimate_gflops} GFLOP/s (config.estimate_gflops) -- an estimate, "
            "not a measurement")


def describe(job: Job, result: Any) -> str:
    """A few words on a finished job, for the progress bar."""
    if job.kind in (EvalJob.kind, PasskeyJob.kind):
        name = table.label(job.encoding, job.scaling, job.finetune_len)
        value = (f"ppl={result['ppl']:.3f}" if job.kind == EvalJob.kind
                 else f"passkey={result['accuracy']:.2f}")
        return f"{name}@{job.eval_len} {value}"
    return f"{job.kind} {job.model}"


def estimate(ctx, todo: Sequence[Job], count: int) -> record.Estimate:
    """The engine's estimate: `config.estimate_gflops` and compile time per job; the printed
    total divided by the workers' speedup (`train.engine.workers.speedup`)."""
    plan, speedup = ctx.plan, workers.speedup(count)
    seconds = {job: plan.estimate(job) for job in todo}
    return record.Estimate(seconds=seconds,
                           line=summary(plan, todo, workers=count, speedup=speedup),
                           record={"estimate_s": sum(seconds.values()) / speedup})


def _timing_table(plan: Plan, results: Mapping[Job, Any], timings: dict) -> str:
    lines = [("Seconds per model, in the process that ran it (with worker processes, each "
              "pinned to its share of the cores, so slower per model than one process with all "
              "of them)."), "", "| model | train (s) | eval (s) |", "|---|---|---|"]
    for job in plan.jobs:
        if job.kind not in (TrainJob.kind, FinetuneJob.kind):
            continue
        train_s = (results.get(job) or {}).get("train_seconds")
        eval_s = sum(float(results[j].get("eval_seconds", 0.0)) for j in plan.jobs_for(job.model)
                     if j.kind in (EvalJob.kind, PasskeyJob.kind) and j in results)
        lines.append(f"| `{job.model}` | {'?' if train_s is None else f'{train_s:.0f}'} | "
                     f"{eval_s:.0f} |")
    lines += ["", ("Invocations of the study in this workdir (wall time includes data "
                   "preparation and compilation, about 2-3 s per evaluation here; the estimate "
                   "is `config.estimate_gflops`'s):"), ""]
    for i, run_ in enumerate(timings, 1):
        load = ", ".join(f"{x:.2f}" for x in run_["load_at_start"])
        workers = int(run_.get("workers", 1))
        how = f" by {workers} worker processes" if workers > 1 else ""
        jobs = run_.get("jobs", run_.get("work_items"))  # work_items: before the engine
        lines.append(f"{i}. {run_['started']}: {jobs} work items in "
                     f"{run_['wall_s']:.0f} s{how} (estimated {run_['estimate_s']:.0f} s); load "
                     f"average (1, 5, 15 min) at the start {load}")
    return "\n".join(lines)


def _scaled_dicts(plan: Plan) -> list[str]:
    scaled = [j for j in plan.of_kind(EvalJob.kind)
              if j.scaling != NO_SCALING and not j.finetune_steps and not j.search]
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
    kwargs = "; ".join(f"`{e}` {plan.train_configs[e].model.encoding_kwargs.to_dict() or '{}'}"
                       for e in plan.encodings if e in plan.train_configs)
    seeds = ", ".join(map(str, plan.seeds))
    lines = [
        (f"- Every model: the same `config.train` ({first.num_train_steps} steps of "
         f"{first.batch_size} x {first.seq_len} tokens), only the encoding differs. Seeds "
         f"(init and data order): {seeds}; with several, every cell is the median and the "
         "brackets the min-max over seeds. Encoding kwargs: " + kwargs + "."),
        (f"- Evaluation: the first {plan.eval_num_tokens} targets of the "
         f"`{plan.config.eval_split}` split, scored in non-overlapping windows of each length "
         "(the same tokens for every length and encoding). Each window starts without "
         "context, so longer windows give the average token more context (as in Press et al. "
         "2022's non-overlapping evaluation)."),
        ("- RoPE scaling: zero-shot (no fine-tuning), factor s = eval_len / L, rebuilt with "
         "the trained params. See `train.engine.scalings.scaling_config` for every parameter; "
         "`dynamic` follows Hugging Face (the base grows as (s * len / L - (s - 1))^(d/(d-2)), "
         "so over a whole window of s * L it is NTK with factor s^2 - s + 1); `longrope` uses "
         "no search: NTK-aware per-dimension factors plus LongRoPE's attention factor; "
         "`longrope-searched`: the factors searched per model and length (LongRoPE search).")]
    return "\n".join(lines + entries.notes(plan.config, plan.encodings, train_len=plan.train_len)
                     + _extension_notes(plan)
                     + _scaled_dicts(plan))


def _extension_notes(plan: Plan) -> list[str]:
    s, out = plan.settings, []
    first = plan.train_configs[plan.models[0]]
    tuned = [j for j in plan.of_kind(FinetuneJob.kind) if not j.model.endswith(
        tuple(f".passkey.ft-{m}" for m in s.ft_scalings))]
    if tuned:
        cfg = plan.train_configs[tuned[0].model]
        steps = cfg.num_train_steps - tuned[0].step
        out.append(
            f"- Fine-tuning (`ft@{s.ft_len}` rows): from the trained model at step "
            f"{tuned[0].step}, {steps} more steps ({s.ft_fraction:.0%} of pretraining) at "
            f"length {s.ft_len} with batch {cfg.batch_size} ({cfg.batch_size * s.ft_len} tokens "
            f"per step; pretraining {first.batch_size * first.seq_len}), the data stream "
            f"continuing (batch "
            f"s is still a pure function of (seed, s)) and the learning-rate schedule extended "
            f"to the new end (about its minimum); the config differs only in seq_len, "
            f"batch_size and the scaling (factor {s.ft_len / plan.train_len:g} for every eval "
            f"length; "
            f"`none` = continued pretraining without scaling). Methods: "
            f"{', '.join(s.ft_scalings)}. Supported length: the largest multiple m of L such "
            "that perplexity stays within 10% of the pretrained model's perplexity at L at "
            "every evaluated multiple up to m L.")
    if s.passkey:
        pk = next(j for j in plan.of_kind(TrainJob.kind) if j.model.endswith(".passkey"))
        cfg = plan.train_configs[pk.model]
        kw = cfg.dataset.kwargs
        out.append(
            f"- Passkey: one model per encoding and seed trained from scratch on the passkey "
            f"task (`train.datasets.passkey`: documents of {kw.min_len}-{kw.max_len} bytes, "
            f"a {extension.PASSKEY_DIGITS}-digit key at a random sentence boundary in filler, "
            f"asked for at the end; packed, {cfg.num_train_steps} steps of {cfg.batch_size} x "
            f"{cfg.seq_len}), otherwise as the perplexity models. Accuracy: exact retrieval of "
            f"all digits (argmax, teacher-forced = greedy) on {s.pk_trials} documents per "
            f"length, the same documents for every model (eval seed {s.pk_eval_seed}). After "
            f"fine-tuning: {s.pk_ft_steps} steps at {s.ft_len} on documents up to {s.ft_len} "
            "bytes.")
    return out


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


def markdown(rows: Sequence[Mapping[str, Any]], passkey_rows: Sequence[Mapping[str, Any]], *,
             train_len: int, order: Sequence[str], claims: Mapping[str, str],
             sections: Mapping[str, str]) -> str:
    """The whole report.md: the ppl table (medians over seeds, min-max in brackets), the
    figure, supported lengths against the claims, passkey retrieval against perplexity,
    the loss table, notes, then `sections`."""
    seeds = sorted({int(r.get("seed", 0) or 0) for r in rows})
    parts = [f"# Length-extrapolation study (trained at L = {train_len})", "",
             (f"Perplexity per byte on held-out windows (lower is better); columns are the "
              f"evaluation lengths, `—` not evaluated, `n/a` cannot be evaluated (see notes). "
              f"Seeds: {', '.join(map(str, seeds))}" + (
                  " (median, min-max in brackets)." if len(seeds) > 1 else ".")),
             "", aggregate.value_table(aggregate.over_seeds(rows, "ppl"), train_len=train_len,
                                     order=order), "",
             f"![perplexity against evaluation length]({files.PLOT})", "",
             "## Supported length", "",
             ("The largest multiple of L at which perplexity stays within 10% of the "
              "pretrained model's perplexity at L (median over seeds, range in brackets), "
              "against the claims in `config.claims`:"), "",
             aggregate.supported_table(rows, train_len=train_len, order=order, claims=claims), ""]
    if passkey_rows:
        blind_table, blind = aggregate.flat_but_blind(rows, passkey_rows, train_len=train_len,
                                                    order=order)
        parts += ["## Passkey retrieval", "",
                  "Accuracy (exact key) of the passkey models:", "",
                  aggregate.value_table(aggregate.over_seeds(passkey_rows, "accuracy"),
                                      train_len=train_len, order=order), "",
                  f"![passkey accuracy against evaluation length]({files.PASSKEY_PLOT})", "",
                  "Passkey against perplexity (the perplexity ratio is the perplexity models'):",
                  "", blind_table, "",
                  ("Perplexity within 10% of L at the longest length but retrieval there below "
                   "50%: " + (", ".join(f"`{b}`" for b in blind) or "none") + "."), ""]
    parts += ["Loss (nats per byte):", "",
              aggregate.value_table(aggregate.over_seeds(rows, "loss"), train_len=train_len,
                                  order=order, fmt="{:.4f}"), ""]
    row_notes = table.notes(list(rows) + list(passkey_rows))
    if row_notes:
        parts += ["Notes:", ""] + [f"- {n}" for n in row_notes] + [""]
    for name, text in sections.items():
        parts += [f"## {name}", "", text.rstrip(), ""]
    return "\n".join(parts)


def _rows(results: Mapping[Job, Any]) -> tuple[list[dict], list[dict]]:
    """(perplexity rows, passkey rows) of the finished evaluations, in plan order."""
    return ([r for j, r in results.items() if j.kind == EvalJob.kind],
            [r for j, r in results.items() if j.kind == PasskeyJob.kind])


def write_results(workdir: files.Workdir, rows: Sequence[Mapping[str, Any]],
                  passkey_rows: Sequence[Mapping[str, Any]] = ()) -> None:
    write_text(workdir.results, table.csv_text(rows))
    if passkey_rows:
        write_text(workdir.passkey, table.passkey_csv_text(passkey_rows))


def write_partial(ctx, results: Mapping[Job, Any]) -> None:
    """results.csv (and passkey.csv) from the evaluations finished so far."""
    write_results(ctx.workdir, *_rows(results))


def write_all(ctx, results: Mapping[Job, Any], timings: Sequence[Mapping[str, Any]]
              ) -> list[str]:
    """results.csv, passkey.csv, the two figures and report.md; their paths."""
    plan, workdir = ctx.plan, ctx.workdir
    rows, passkey_rows = _rows(results)
    write_results(workdir, rows, passkey_rows)
    order = list(plan.encodings)
    seeds = f" (seeds {', '.join(map(str, plan.seeds))}: median, min-max bars)" \
        if len(plan.seeds) > 1 else ""
    figures.perplexity_figure(workdir.plot, aggregate.over_seeds(rows, "ppl"),
                              train_len=plan.train_len, order=order, note=seeds)
    if passkey_rows:
        figures.passkey_figure(workdir.passkey_plot, aggregate.over_seeds(passkey_rows, "accuracy"),
                               train_len=plan.train_len, order=order, note=seeds)
    corpus_text = json.dumps(ctx.corpus, indent=1, sort_keys=True, default=str)
    found = searched.search_table(results)
    s = searched.settings(plan.config)
    sections = {
        **({"LongRoPE search": (
            f"`longrope-searched` rows: LongRoPE's evolutionary search per model and length "
            f"(`train.study.searched`: population {s.search.population}, parents "
            f"{s.search.parents}, {s.search.mutations} mutations + {s.search.crossovers} "
            f"crossovers x {s.search.generations} generations, seed {s.search.seed}), scored by "
            f"the model's perplexity on {s.tokens} bytes of the `{s.split}` split at that "
            f"length (never the test split the tables score). Perplexity of each seed and of "
            f"the best candidate on those bytes:\n\n" + found)} if found else {}),
        "How it was measured": _method_notes(plan),
        "Timings": _timing_table(plan, results, timings),
        "Machine": machine(),
        "Corpus": f"```json\n{corpus_text}\n```",
        "Study configuration": "```\n" + "\n".join(config_lines(plan.config)) + "\n```",
    }
    claims = dict((plan.config.get("claims") or {}).items()) if plan.config.get("claims") \
        else {}
    write_text(workdir.report, markdown(rows, passkey_rows, train_len=plan.train_len,
                                        order=order, claims=claims, sections=sections))
    return [workdir.results, workdir.report, workdir.plot]


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

"""The study's `longrope-searched` method: LongRoPE's factors searched on each trained model.

Every other scaling method of `config.scalings` is a rule (`train.engine.scalings`: factor =
eval_len / L in, a dict out). `longrope-searched` is LongRoPE as its paper does it (Ding et al.
2024; `train.longrope`): for each model that takes a scaling and each eval length n past L, an
evolutionary search over per-pair rescale factors and the count of initial positions kept
unscaled, scored by the model's own perplexity at n on `config.longrope_search.split` (the
validation split: the study's scores are on the test split, which the search never reads).
The best candidate is then evaluated zero-shot beside the rules, like them.

  config.longrope_search   generations, population, parents, mutations, crossovers, rate,
                           seed (the search's), tokens (scored per candidate: windows of n =
                           max(1, tokens // n)), split, starts ('' : the paper's start counts
                           below L; '0': none, so the factors export to transformers)

Jobs: one `SearchJob` per (model, n), planned just before the evaluation that reads it (the
same model, so the same worker); its result (the candidate, its perplexity, the seeds' and the
search's cost) is stored like an evaluation's row, and its generations under
<workdir>/<model>/longrope-<n>/ (`train.longrope.progress`), so a killed study resumes the
search from its last generation. The evaluation's fingerprint includes the search's.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import ml_collections
import numpy as np

from posenc_jax.checks import integer, positive_int
from train import state as state_lib
from train.engine import scalings
from train.engine.flops import dense_forward_flops_per_token as flops_per_token
from train.engine.store import fingerprint, read_json
from train.longrope import export
from train.longrope.fitness import Perplexity, windows
from train.longrope.search import SearchConfig, search
from train.longrope.space import Candidate
from train.study.jobs import Job

SEARCHED = "longrope-searched"
_SEARCH_KEYS = ("generations", "population", "parents", "mutations", "crossovers", "rate",
                "seed")


def methods() -> tuple[str, ...]:
    """What `config.scalings` may name: the rules, then the searched method."""
    return (*scalings.methods(), SEARCHED)


@dataclasses.dataclass(frozen=True)
class Settings:
    """config.longrope_search, checked."""

    search: SearchConfig
    tokens: int
    split: str
    starts: tuple[int, ...] | None        # None: the paper's below L

    def identity(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.search), "tokens": self.tokens, "split": self.split,
                "starts": self.starts}


def settings(config) -> Settings:
    """Checks config.longrope_search (absent: the search's defaults, 2048 tokens)."""
    raw = config.get("longrope_search") or ml_collections.ConfigDict()
    unknown = sorted(set(raw) - {*_SEARCH_KEYS, "tokens", "split", "starts"})
    if unknown:
        raise ValueError(f"config.longrope_search has unknown keys {unknown}; valid: "
                         f"{', '.join(_SEARCH_KEYS)}, tokens, split, starts")
    try:
        search_config = SearchConfig(**{k: raw[k] for k in _SEARCH_KEYS if k in raw})
    except (TypeError, ValueError) as error:
        raise ValueError(f"config.longrope_search: {error}") from None
    text = str(raw.get("starts", "") or "").strip()
    try:
        starts = tuple(int(s) for s in text.split(",") if s.strip()) or None
    except ValueError:
        raise ValueError(f"config.longrope_search.starts={text!r} must be '' or a comma list "
                         "of ints >= 0") from None
    if starts and min(starts) < 0:
        raise ValueError(f"config.longrope_search.starts={text!r} must be ints >= 0")
    return Settings(search=search_config,
                    tokens=positive_int("config.longrope_search.tokens", raw.get("tokens", 2048)),
                    split=str(raw.get("split", "validation")), starts=starts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchJob(Job):
    """Search LongRoPE factors for the trained `source` (default `model`) stretched from
    `train_len` to `target_len`; its result is stored like an evaluation's (see the module
    docstring). A fine-tune's search (`source` its base) is the first job of the fine-tuned
    `model`, so that the fine-tune runs after it in the same worker."""

    kind: ClassVar[str] = "longrope_search"
    rate_key: ClassVar[str] = "estimate_search_gflops"  # batch-1 windows, the model's attention
    train_len: int
    target_len: int
    settings: Any = ()      # Settings.identity(), frozen
    source: str = ""

    @property
    def searched_model(self) -> str:
        """The model whose trained params the search runs."""
        return self.source or self.model

    @property
    def name(self) -> str:
        return f"{self.model}+{SEARCHED}@{self.target_len}.search"


def plan_search(config, *, model: str, train_fp: str, mc, train_len: int, target_len: int,
                source: str = "") -> SearchJob:
    """The search job of `model` (of `source`'s params, when given) at `target_len`."""
    s = settings(config)
    samples = max(1, s.tokens // target_len)
    return SearchJob(model=model, train_len=train_len, target_len=target_len, source=source,
                     settings=tuple(sorted(s.identity().items())),
                     fingerprint=fingerprint({"train": train_fp, "target": target_len,
                                              "search": s.identity()}),
                     flops=s.search.evaluations * flops_per_token(mc, target_len)
                     * samples * target_len,
                     compiles=1)  # one program for every candidate (`train.longrope.fitness`)


def run_search(ctx, job: SearchJob, *, params) -> dict:
    """Runs (or resumes) the job's search on the model's trained `params`; returns the best
    candidate as its result row."""
    start = time.perf_counter()
    s = settings(ctx.plan.config)
    cfg = ctx.plan.train_configs[job.searched_model]
    setup = ctx.runtime.setup(cfg, ctx.mesh)
    model = state_lib.merge_model(setup, params)
    stream = ctx.runtime.stream(cfg.dataset, s.split)
    samples = max(1, s.tokens // job.target_len)
    tokens = windows(np.asarray(stream.tokens), target_length=job.target_len, samples=samples)
    fit = Perplexity.of_model(model, tokens, original=job.train_len, scan_layers=False)
    space = fit.space(starts=s.starts)
    seeds = fit.seeds(space)
    folder = os.path.join(ctx.workdir.model_dir(job.model), f"longrope-{job.target_len}")
    result = search(fit, space, s.search, seeds=seeds, workdir=folder)
    seeded = {name: result.values.get(c) for name, c in zip(("pi", "ntk", "yarn"), seeds)}
    return {"model": job.model, "train_len": job.train_len, "target_len": job.target_len,
            "candidate": result.best.to_json(), "step": space.step,
            "long_factor": list(result.best.factors(space.step)),
            "unscaled_start": result.best.start, "search_ppl": result.value,
            "seed_ppl": seeded, "evaluations": len(result.values),
            "generations": len(result.records),
            "ntk_factor": list(seeds[1].factors(space.step)),
            "search_seconds": time.perf_counter() - start}


def encoding_kwargs(workdir, base: dict[str, Any], search: tuple[str, str], *,
                    train_len: int, target_len: int) -> dict[str, Any]:
    """The encoding kwargs of a model with the searched factors (an evaluation's, or a
    fine-tune's): `base` plus the longrope dict for `target_len` (the length searched at) and
    `unscaled_start`, from the stored result of the search `search` = (job name,
    fingerprint); RuntimeError when it is missing (the search runs first)."""
    name, expected = search
    row = read_json(workdir.job(name))
    if not isinstance(row, dict) or row.get("fingerprint") != expected:
        raise RuntimeError(f"the evaluation needs the result of search {name!r} "
                           f"(fingerprint {expected}), which is not in {workdir.evals}")
    scaling = export.scaling_dict(Candidate.from_json(row["candidate"]), step=row["step"],
                                  original_max_position_embeddings=train_len,
                                  target_length=target_len)
    return {**base, "scaling": scaling,
            "unscaled_start": integer("unscaled_start", row["unscaled_start"], minimum=0)}


def tuned_config(workdir, config, search: tuple[str, str], *, train_len: int):
    """A fine-tune's train config (`extension.finetunes`: seq_len the fine-tune length) with
    the searched factors of `search` in its encoding kwargs: the paper's recipe, search at
    the target length, then fine-tune with those factors there. A copy; `config` is kept."""
    out = copy.deepcopy(config)
    with out.unlocked():
        out.model.encoding_kwargs = encoding_kwargs(
            workdir, dict(config.model.encoding_kwargs.to_dict()), search, train_len=train_len,
            target_len=int(config.seq_len))
    return out


def search_table(results: Mapping[Any, dict]) -> str:
    """Markdown: per search, the perplexity on the search's own tokens of its PI / NTK /
    YaRN seeds and of the best candidate, its start count, evaluations and seconds, and the
    found factors beside the NTK rule's (first, middle and last pair)."""
    rows = [r for j, r in results.items() if j.kind == SearchJob.kind]
    if not rows:
        return ""
    out = [("| model | length | PI | NTK | YaRN | searched | start | evaluations | seconds | "
            "factors (first, middle, last pair) | NTK rule's |"), "|" + "---|" * 11]

    def ends(f):
        return ", ".join(f"{v:g}" for v in (f[0], f[len(f) // 2], f[-1]))

    for r in rows:
        seed = {k: ("—" if v is None else f"{v:.3f}") for k, v in r["seed_ppl"].items()}
        out.append(f"| `{r['model']}` | {r['target_len']} | {seed['pi']} | {seed['ntk']} | "
                   f"{seed['yarn']} | {r['search_ppl']:.3f} | {r['unscaled_start']} | "
                   f"{r['evaluations']} | {r['search_seconds']:.0f} | {ends(r['long_factor'])} "
                   f"| {ends(r['ntk_factor'])} |")
    return "\n".join(out)

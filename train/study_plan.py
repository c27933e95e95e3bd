"""The study's plan: every config checked, every work item listed, before any training.

`make_plan(config, workdir)` parses and validates the study config (see configs/study.py for
the keys) and returns a `Plan`: one training config per encoding (all from `config.train`,
differing only in `model.encoding` and its kwargs), the evaluation items, fingerprints that
say whether a finished training or evaluation in the workdir can be reused, and cost
estimates. Anything wrong raises ValueError naming the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
from typing import Any

SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
NO_SCALING = "none"
# Keys of the train config that do not change the trained weights (beyond float rounding).
_NOT_FINGERPRINTED = ("log_every_steps", "checkpoint_every_steps", "checkpoints_to_keep",
                      "async_checkpointing", "eval", "eval_every_steps", "mesh",
                      "logical_axis_rules")
MARKER = "study_train.json"


@dataclasses.dataclass(frozen=True)
class EvalItem:
    """One evaluation: `encoding` (+ RoPE `scaling`) at `eval_len`; a `note` means n/a."""

    encoding: str
    scaling: str
    eval_len: int
    note: str = ""


def parse_names(value: Any, *, what: str, valid: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """'a,b' (or a sequence) -> ('a', 'b'), each checked against `valid`."""
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        names = [str(v).strip() for v in value]
    else:
        raise TypeError(f"config.{what} must be a comma-separated string, got {value!r}")
    for name in names:
        if name not in valid:
            raise ValueError(f"unknown {what[:-1]} {name!r} in config.{what}={value!r}; valid "
                             f"names are: {', '.join(valid)}")
    if len(set(names)) != len(names):
        raise ValueError(f"config.{what}={value!r} names an entry twice")
    return tuple(names)


def parse_lengths(spec: Any, *, train_len: int) -> tuple[int, ...]:
    """'L/2,L,2L,16L,3000' -> sorted distinct positive ints (L = train_len)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = set()
    for raw in items:
        text = str(raw).strip().replace(" ", "")
        m = re.fullmatch(r"(\d+)?\*?L(?:/(\d+))?", text)
        if m:
            mult, div = int(m.group(1) or 1), int(m.group(2) or 1)
            if div == 0 or (mult * train_len) % div:
                raise ValueError(f"eval length {text!r} is not a whole number of tokens for "
                                 f"L={train_len}")
            value = mult * train_len // div
        elif re.fullmatch(r"\d+", text):
            value = int(text)
        else:
            raise ValueError(f"eval length {raw!r} in config.eval_lengths must be a positive int "
                             "or a multiple of L such as 'L/2', 'L', '4L'")
        if value < 1:
            raise ValueError(f"eval length {raw!r} must be a positive number of tokens, got "
                             f"{value}")
        out.add(value)
    if not out:
        raise ValueError(f"config.eval_lengths={spec!r} names no length")
    return tuple(sorted(out))


def scaling_config(method: str, *, factor: float, train_len: int, rotary_dim: int,
                   overrides: dict | None = None) -> dict[str, Any]:
    """The Hugging Face style scaling dict for `method` stretching RoPE from L to factor * L.

    linear, ntk: {factor}. dynamic, yarn: + original_max_position_embeddings = L (YaRN's
    betas, truncation and attention factor at their defaults). llama3: low_freq_factor 1,
    high_freq_factor 4 as in Llama 3.1 (band edges at L and L/4 wavelengths). longrope: its
    per-dimension factors are normally found by search; we use no search but the NTK-aware
    rescale, long_factor_i = factor^(2i / (d - 2)) (the lowest frequency divided by exactly
    `factor`; the same frequencies as `ntk`), short_factor = 1, plus LongRoPE's attention
    factor sqrt(1 + ln(factor) / ln(L)): so rope+longrope vs rope+ntk isolates that factor.
    `overrides` (config.scaling_overrides.<method>) replace any of these keys.
    """
    cfg: dict[str, Any] = {"rope_type": method, "factor": float(factor)}
    if method in ("dynamic", "yarn", "llama3", "longrope"):
        cfg["original_max_position_embeddings"] = int(train_len)
    if method == "llama3":
        cfg.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if method == "longrope":
        r = rotary_dim // 2
        cfg["short_factor"] = [1.0] * r
        cfg["long_factor"] = [float(factor) ** (2 * i / (rotary_dim - 2)) if rotary_dim > 2
                              else float(factor) for i in range(r)]
    cfg.update(dict(overrides or {}))
    return cfg



def _eval_rows(batch_tokens: int, eval_len: int, shards: int) -> int:
    """Windows per eval batch: batch_tokens // eval_len, at least 1, rounded up to a multiple
    of the batch-sharding size."""
    rows = max(1, batch_tokens // eval_len)
    return -(-rows // shards) * shards

def fingerprint(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _train_fingerprint(cfg) -> str:
    d = cfg.to_dict()
    return fingerprint({k: v for k, v in d.items() if k not in _NOT_FINGERPRINTED})


def _model_flops_per_token(mc, length: int) -> float:
    """Forward FLOPs per token of a TransformerConfig at sequence length `length` (dense
    attention computes the full L x L score matrix)."""
    e, h, k, d, f = mc.embed_dim, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.mlp_dim
    per_layer = 2 * e * h * d + 2 * e * k * d + (3 if mc.mlp_activation == "swiglu" else 2) * e * f
    return 2.0 * (mc.num_layers * per_layer + e * mc.vocab_size) + 4.0 * mc.num_layers * length * h * d


@dataclasses.dataclass
class Plan:
    workdir: str
    config: Any                        # the study ConfigDict
    encodings: tuple[str, ...]
    scalings: tuple[str, ...]
    train_len: int
    eval_lens: tuple[int, ...]
    eval_num_tokens: int
    train_configs: dict[str, Any]      # encoding -> train ConfigDict
    model_configs: dict[str, Any]      # encoding -> TransformerConfig
    fingerprints: dict[str, str]       # encoding -> train fingerprint
    scaled_kwargs: dict[tuple[str, int], dict]   # (scaling, eval_len) -> rope encoding_kwargs
    eval_items: list[EvalItem]
    eval_stream: Any
    corpus: dict
    batch_shards: int

    def model_dir(self, encoding: str) -> str:
        return os.path.join(self.workdir, encoding)

    evals_dir = property(lambda self: os.path.join(self.workdir, "evals"))
    results_path = property(lambda self: os.path.join(self.workdir, "results.csv"))
    report_path = property(lambda self: os.path.join(self.workdir, "report.md"))
    plot_path = property(lambda self: os.path.join(self.workdir, "extrapolation.png"))
    timings_path = property(lambda self: os.path.join(self.workdir, "timings.json"))

    def eval_path(self, item: EvalItem) -> str:
        return os.path.join(self.evals_dir, f"{item.encoding}+{item.scaling}@{item.eval_len}.json")

    def items_for(self, encoding: str) -> list[EvalItem]:
        return [i for i in self.eval_items if i.encoding == encoding]

    def model_overrides(self, item: EvalItem) -> dict[str, Any]:
        base = self.train_configs[item.encoding].model
        out: dict[str, Any] = {}
        if item.scaling != NO_SCALING:
            out["encoding_kwargs"] = self.scaled_kwargs[(item.scaling, item.eval_len)]
        attention = self.config.get("eval_attention") or base.attention
        if attention != base.attention:
            out["attention"] = attention
        if self.config.get("eval_block_size"):
            out["block_size"] = int(self.config.eval_block_size)
        return out

    def eval_batch(self, eval_len: int) -> int:
        """Windows per eval batch: eval_batch_tokens // eval_len, at least 1, rounded up to a
        multiple of the batch-sharding size."""
        return _eval_rows(int(self.config.eval_batch_tokens), eval_len, self.batch_shards)

    def eval_fingerprint(self, item: EvalItem) -> str:
        return fingerprint({
            "train": self.fingerprints[item.encoding], "len": item.eval_len,
            "scaling": self.scaled_kwargs.get((item.scaling, item.eval_len)),
            "tokens": self.eval_num_tokens, "split": self.config.eval_split, "note": item.note})

    def estimate(self, work: tuple[str, Any]) -> float:
        """Estimated seconds of one work item: FLOPs / config.estimate_gflops + compile time."""
        kind, what = work
        rate = float(self.config.estimate_gflops) * 1e9
        if kind == "train":
            tc = self.train_configs[what]
            tokens = tc.num_train_steps * tc.batch_size * tc.seq_len
            flops = 3 * _model_flops_per_token(self.model_configs[what], tc.seq_len) * tokens
            return flops / rate + float(self.config.estimate_compile_s) * 3
        if what.note:
            return 0.0
        mc = self.model_configs[what.encoding]
        flops = _model_flops_per_token(mc, what.eval_len) * self.eval_num_tokens
        return flops / rate + float(self.config.estimate_compile_s)

    def summary(self, todo: list[tuple[str, Any]]) -> str:
        trains = [w for w in todo if w[0] == "train"]
        evals = [w for w in todo if w[0] == "eval"]
        est = sum(self.estimate(w) for w in todo)
        return (f"study: {len(self.encodings)} encodings ({', '.join(self.encodings)}), "
                f"L={self.train_len}, eval lengths {list(self.eval_lens)}, scalings "
                f"{list(self.scalings) or 'none'}; to do: {len(trains)} trainings, {len(evals)} "
                f"evaluations (reused: {len(self.encodings) - len(trains)} trainings, "
                f"{len(self.eval_items) - len(evals)} evaluations); estimated "
                f"{est / 60:.1f} min at {self.config.estimate_gflops} GFLOP/s "
                f"(config.estimate_gflops) -- an estimate, not a measurement")


def _train_config(config, encoding: str, train_len: int):
    import ml_collections

    cfg = copy.deepcopy(config.train)
    kwargs = dict(config.encoding_kwargs.get(encoding, None) or {})
    if encoding == "learned":
        kwargs.setdefault("max_len", train_len)
    if encoding == "t5":
        kwargs.setdefault("max_distance", train_len)
    with cfg.unlocked():
        cfg.model.encoding = encoding
        cfg.model.encoding_kwargs = ml_collections.ConfigDict(kwargs)
        cfg.eval.lengths = ()
        cfg.eval_every_steps = 0
    return cfg


def _eval_bytes(mc, *, batch: int, length: int, attention: str, block: int) -> float:
    """Rough peak bytes of one eval forward pass (float32 activations)."""
    keys = length if attention == "dense" else min(block, length)
    scores = 3.0 * batch * mc.num_heads * length * keys * 4
    acts = 4.0 * batch * length * (max(mc.mlp_dim, mc.embed_dim) * 2 + mc.vocab_size * 2)
    return scores + acts


def _check_workdir(plan_dir: str, encoding: str, fp: str) -> None:
    from train.checkpoint import CHECKPOINT_DIR

    marker_path = os.path.join(plan_dir, MARKER)
    if os.path.exists(marker_path):
        with open(marker_path) as f:
            marker = json.load(f)
        if marker.get("fingerprint") != fp:
            raise ValueError(
                f"{plan_dir} holds a training of {encoding!r} made with a different train "
                f"config (fingerprint {marker.get('fingerprint')} != {fp}); use another "
                "--workdir or remove that directory")
    elif os.path.isdir(os.path.join(plan_dir, CHECKPOINT_DIR)):
        raise ValueError(f"{plan_dir} holds checkpoints that this study did not write (no "
                         f"{MARKER}); use another --workdir or remove that directory")


def make_plan(config, workdir: str) -> Plan:
    """Validates `config` (a study ConfigDict) against `workdir` and lists the work."""
    import posenc_jax
    from train import data, sharding, state

    if not workdir:
        raise ValueError("workdir must be a non-empty path")
    workdir = os.path.abspath(workdir)
    encodings = parse_names(config.encodings, what="encodings", valid=posenc_jax.names())
    if not encodings:
        raise ValueError(f"config.encodings={config.encodings!r} names no encoding; valid "
                         f"names are: {', '.join(posenc_jax.names())}")
    scalings = parse_names(config.scalings, what="scalings", valid=SCALINGS)
    train_len = config.train.seq_len
    if isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 1:
        raise ValueError(f"config.train.seq_len must be a positive int, got {train_len!r}")
    eval_lens = parse_lengths(config.eval_lengths, train_len=train_len)
    num_tokens = config.eval_num_tokens
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"config.eval_num_tokens must be a positive int, got {num_tokens!r}")
    short = [n for n in eval_lens if n > num_tokens]
    if short:
        raise ValueError(f"eval length(s) {short} exceed config.eval_num_tokens={num_tokens}: "
                         "they would have zero full windows; raise eval_num_tokens or drop them")
    if config.get("eval_attention") not in (None, "", "dense", "blockwise"):
        raise ValueError(f"config.eval_attention must be '', 'dense' or 'blockwise', got "
                         f"{config.eval_attention!r}")

    train_configs, model_configs, fingerprints = {}, {}, {}
    for enc in encodings:
        cfg = _train_config(config, enc, train_len)
        mc = state.transformer_config(cfg.model)
        max_pos = mc.input_encoding.max_positions
        if max_pos is not None and max_pos < train_len:
            raise ValueError(f"encoding {enc!r} has max_len={max_pos} < the training length "
                             f"L={train_len}: it cannot be trained at L")
        train_configs[enc], model_configs[enc] = cfg, mc
        fingerprints[enc] = _train_fingerprint(cfg)
        _check_workdir(os.path.join(workdir, enc), enc, fingerprints[enc])

    some = train_configs[encodings[0]]
    mesh = sharding.make_mesh(some.mesh)
    batch_shards = int(mesh.shape["data"] * mesh.shape["fsdp"])
    scaled_kwargs, items = {}, []
    for enc in encodings:
        mc = model_configs[enc]
        max_pos = mc.input_encoding.max_positions
        for n in eval_lens:
            note = "" if max_pos is None or n <= max_pos else (
                f"n/a (positions >= max_len={max_pos}: the learned table has no rows for them)")
            items.append(EvalItem(enc, NO_SCALING, n, note))
        if enc != "rope":
            continue
        rotary_dim = mc.layer_encoding(0).rotary_dim
        base_kwargs = dict(train_configs[enc].model.encoding_kwargs.to_dict())
        for method in scalings:
            overrides = dict((config.get("scaling_overrides") or {}).get(method, None) or {})
            for n in eval_lens:
                if n <= train_len:
                    continue
                scaling = scaling_config(method, factor=n / train_len, train_len=train_len,
                                         rotary_dim=rotary_dim, overrides=overrides)
                kwargs = {**base_kwargs, "scaling": scaling}
                state.transformer_config(train_configs[enc].model, encoding_kwargs=kwargs)
                scaled_kwargs[(method, n)] = kwargs
                items.append(EvalItem(enc, method, n))

    mem_limit = float(config.max_eval_memory_gb) * 2**30
    for enc in encodings:
        mc = model_configs[enc]
        attention = config.get("eval_attention") or mc.attention
        block = int(config.get("eval_block_size") or mc.block_size)
        for n in eval_lens:
            rows = _eval_rows(int(config.eval_batch_tokens), n, batch_shards)
            need = _eval_bytes(mc, batch=rows, length=n, attention=attention, block=block)
            if need > mem_limit:
                raise ValueError(
                    f"eval length {n} with {attention} attention needs about {need / 2**30:.1f} "
                    f"GiB (batch {rows}) > config.max_eval_memory_gb={config.max_eval_memory_gb};"
                    " use eval_attention='blockwise', lower eval_batch_tokens, or drop the length")

    ds = some.dataset
    stream = data.config_stream(ds, config.eval_split)
    if num_tokens >= len(stream):
        raise ValueError(f"config.eval_num_tokens={num_tokens} must be < the {len(stream)} "
                         f"tokens of the {config.eval_split!r} split")
    corpus = data.corpus_identity(ds.data_dir, name=ds.name, **ds.kwargs.to_dict())
    corpus["eval_split_tokens"] = len(stream)
    return Plan(workdir=workdir, config=config, encodings=encodings, scalings=scalings,
                train_len=train_len, eval_lens=eval_lens, eval_num_tokens=num_tokens,
                train_configs=train_configs, model_configs=model_configs,
                fingerprints=fingerprints, scaled_kwargs=scaled_kwargs, eval_items=items,
                eval_stream=stream, corpus=corpus, batch_shards=batch_shards)

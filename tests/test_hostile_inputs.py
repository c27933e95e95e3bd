"""Hostile inputs: one table of bad values across the library and the training CLI.

Each row is (id, a call that must fail, the exception type, words its message must contain).
The classes (issue 15), not only the examples: every numeric hyperparameter finite and of the
right type, every boolean a bool, every size a positive int, every shape checked where it
enters, every token id inside the vocabulary, and every setting of an experiment that cannot
work refused before the first step, naming the key as it is typed.

Categories (the first word of each id): bool, nonfinite, type, size, shape, range, dtype,
scaling, hf, model, generate, cache, attention, config (the trainer's config, in process),
cli (`python -m train`'s main, each row in a process of its own forked from one
that imported the CLI once: exit status 1 and the words on stderr).

Not here: the Hugging Face config.json sizes (num_attention_heads 0, max_position_embeddings
"x" or 128.5, a non-integral hidden_size or head_dim) and softmax_scale_factor without a
factor: issue 12 rewrites that reader (posenc_jax.encodings.hf), and its tests own them. The
rope_scaling values it passes on (non-finite, wrong type) are here.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental import checkify

import posenc_jax
from posenc_jax.encodings import hf_config, learned, relative, rope, rope_scaling, sinusoidal
from posenc_jax.model import attention, generate, kv_cache
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.transformer import Transformer

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAN, INF = float("nan"), float("inf")
MODEL = {"vocab_size": 32, "num_layers": 1, "embed_dim": 16, "num_heads": 2, "mlp_dim": 32}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LONG = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 64, "factor": 2.0}
HF = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
      "rope_theta": 10000.0}


def cfg(**kw):
    return TransformerConfig(**{**MODEL, **kw})


def rope_enc(**kw):
    return posenc_jax.get("rope", **{"head_dim": 8, **kw})


def yarn(**kw):
    return rope_enc(scaling={**YARN, **kw})


def hf(**kw):
    return hf_config.rope_kwargs_from_hf_config({**HF, **kw})


def hf_scaled(**kw):
    return hf(rope_scaling={**YARN, **kw})


def model(**kw):
    return Transformer(cfg(**kw), rngs=nnx.Rngs(0))


def tokens(*ids):
    return jnp.asarray([ids], jnp.int32)


def learned_embed(x):
    enc = posenc_jax.get("learned", embed_dim=8, max_len=16)
    return enc.embed(enc.init(jax.random.key(0)), x, POS)


GEMMA3 = {"model_type": "gemma3_text", "head_dim": 16, "hidden_size": 32,
          "num_attention_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 128,
          "layer_types": ["sliding_attention", "full_attention"],
          "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 10000.0}}}
LLAMA = {"model_type": "llama", "vocab_size": 32, "num_hidden_layers": 1, "hidden_size": 64,
         "num_attention_heads": 1, "intermediate_size": 64, "max_position_embeddings": 128}


def cope_bias(positions):
    enc = posenc_jax.get("cope", head_dim=8, npos_max=4)
    return enc.row_bias(enc.init(None), positions, positions, q=jnp.zeros((1, 1, 1, 8)),
                        logits=jnp.zeros((1, 1, 1, 1)))


def jitted_step(m, t, cache):
    return nnx.jit(lambda mod, t, c: kv_cache.step(mod, t, None, None, c))(m, t, cache)


QKV = jnp.zeros((1, 4, 2, 8), jnp.float32)
POS = jnp.arange(4, dtype=jnp.int32)


def attend(**kw):
    args = {"q": QKV, "k": QKV, "v": QKV, "encoding": posenc_jax.get("nope"),
            "q_positions": POS, "k_positions": POS, **kw}
    return attention.attend(**args)


LIBRARY = [
    # -- booleans given as anything but a bool
    ("bool-causal-str", lambda: cfg(causal="False"), TypeError, ["causal", "bool", "'False'"]),
    ("bool-causal-int", lambda: cfg(causal=0), TypeError, ["causal", "bool"]),
    ("bool-tie-str", lambda: cfg(tie_embeddings="False"), TypeError, ["tie_embeddings", "bool"]),
    ("bool-tie-none", lambda: cfg(tie_embeddings=None), TypeError, ["tie_embeddings", "bool"]),
    ("bool-t5-bidirectional-str",
     lambda: posenc_jax.get("t5", num_heads=2, bidirectional="False"), TypeError,
     ["bidirectional", "bool"]),
    ("bool-t5-bidirectional-int", lambda: relative.t5_bucket(
        jnp.zeros(3, jnp.int32), bidirectional=1), TypeError, ["bidirectional", "bool"]),
    ("bool-yarn-truncate-str", lambda: yarn(truncate="no"), TypeError, ["truncate", "bool"]),
    ("bool-attend-causal-str", lambda: attend(causal="yes"), TypeError, ["causal", "bool"]),
    # -- numbers that are not finite
    ("nonfinite-rope-base-inf", lambda: rope_enc(base=INF), ValueError, ["base", "finite"]),
    ("nonfinite-rope-base-nan", lambda: rope_enc(base=NAN), ValueError, ["base", "finite"]),
    ("nonfinite-inv-freq-base-inf", lambda: rope.inv_freq(8, base=INF), ValueError,
     ["base", "finite"]),
    ("nonfinite-sinusoidal-base-inf", lambda: sinusoidal.encode(POS, 8, base=INF), ValueError,
     ["base", "finite"]),
    ("nonfinite-sinusoidal-base-nan", lambda: posenc_jax.get("sinusoidal", embed_dim=8,
                                                             base=NAN), ValueError,
     ["base", "finite"]),
    ("nonfinite-linear-factor-inf", lambda: rope_enc(scaling={"rope_type": "linear",
                                                              "factor": INF}), ValueError,
     ["factor", "finite"]),
    ("nonfinite-linear-factor-nan", lambda: rope_enc(scaling={"rope_type": "linear",
                                                              "factor": NAN}), ValueError,
     ["factor", "finite"]),
    ("nonfinite-ntk-factor-inf", lambda: rope_enc(scaling={"rope_type": "ntk", "factor": INF}),
     ValueError, ["factor", "finite"]),
    ("nonfinite-yarn-factor-nan", lambda: yarn(factor=NAN), ValueError, ["factor", "finite"]),
    ("nonfinite-yarn-beta-fast-nan", lambda: yarn(beta_fast=NAN), ValueError,
     ["beta_fast", "finite"]),
    ("nonfinite-yarn-beta-slow-inf", lambda: yarn(beta_slow=INF), ValueError,
     ["beta_slow", "finite"]),
    ("nonfinite-yarn-mscale-inf", lambda: yarn(mscale=INF, mscale_all_dim=1.0), ValueError,
     ["mscale", "finite"]),
    ("nonfinite-yarn-attention-factor-nan", lambda: yarn(attention_factor=NAN), ValueError,
     ["attention_factor", "finite"]),
    ("nonfinite-yarn-original-inf", lambda: yarn(original_max_position_embeddings=INF),
     ValueError, ["original_max_position_embeddings", "finite"]),
    ("nonfinite-longrope-short-nan", lambda: rope_enc(scaling={
        **LONG, "short_factor": [1.0, NAN, 1.0, 1.0]}), ValueError,
     ["short_factor[1]", "finite"]),
    ("nonfinite-longrope-long-inf", lambda: rope_enc(scaling={
        **LONG, "long_factor": [INF, 1.0, 1.0, 1.0]}), ValueError,
     ["long_factor[0]", "finite"]),
    ("nonfinite-longrope-factor-inf", lambda: rope_enc(scaling={**LONG, "factor": INF}),
     ValueError, ["factor", "finite"]),
    ("nonfinite-llama3-low-nan", lambda: rope_enc(scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": NAN, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), ValueError, ["low_freq_factor", "finite"]),
    ("nonfinite-llama3-high-inf", lambda: rope_enc(scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": INF,
        "original_max_position_embeddings": 64}), ValueError, ["high_freq_factor", "finite"]),
    ("nonfinite-scaling-rope-theta-inf", lambda: rope_enc(scaling={
        "rope_type": "linear", "factor": 2.0, "rope_theta": INF}), ValueError,
     ["rope_theta", "finite"]),
    ("nonfinite-partial-rotary-nan", lambda: rope_enc(partial_rotary_factor=NAN), ValueError,
     ["partial_rotary_factor"]),
    ("nonfinite-norm-eps-nan", lambda: cfg(norm_eps=NAN), ValueError, ["norm_eps", "finite"]),
    ("nonfinite-norm-eps-inf", lambda: cfg(norm_eps=INF), ValueError, ["norm_eps", "finite"]),
    ("nonfinite-learned-stddev-nan", lambda: posenc_jax.get("learned", embed_dim=8,
                                                            stddev=NAN), ValueError,
     ["stddev", "finite"]),
    ("nonfinite-temperature-nan", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, temperature=NAN), ValueError,
     ["temperature"]),
    ("nonfinite-temperature-inf", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, temperature=INF, rng=jax.random.key(0)),
     ValueError, ["temperature", "finite"]),
    ("nonfinite-hf-rope-theta-inf", lambda: hf(rope_theta=INF), ValueError,
     ["rope_theta", "finite"]),
    ("nonfinite-hf-rope-theta-nan", lambda: hf(rope_theta=NAN), ValueError,
     ["rope_theta", "finite"]),
    ("nonfinite-hf-factor-inf", lambda: hf_scaled(factor=INF), ValueError,
     ["factor", "finite"]),
    ("nonfinite-hf-partial-inf", lambda: hf(partial_rotary_factor=INF), ValueError,
     ["partial_rotary_factor"]),
    # -- values of the wrong type
    ("type-rope-base-str", lambda: rope_enc(base="10000"), TypeError, ["base", "'10000'"]),
    ("type-rope-head-dim-float", lambda: rope_enc(head_dim=8.0), TypeError, ["head_dim"]),
    ("type-rope-rotary-dim-str", lambda: rope_enc(rotary_dim="8"), TypeError, ["rotary_dim"]),
    ("type-rope-layout-int", lambda: rope_enc(layout=1), ValueError, ["layout"]),
    ("type-scaling-list", lambda: rope_enc(scaling=["yarn"]), TypeError, ["scaling", "dict"]),
    ("type-factor-str", lambda: rope_enc(scaling={"rope_type": "linear", "factor": "2"}),
     TypeError, ["factor"]),
    ("type-factor-bool", lambda: rope_enc(scaling={"rope_type": "linear", "factor": True}),
     TypeError, ["factor"]),
    ("type-longrope-factors-str", lambda: rope_enc(scaling={**LONG, "short_factor": "1111"}),
     TypeError, ["short_factor"]),
    ("type-alibi-heads-float", lambda: posenc_jax.get("alibi", num_heads=2.0), TypeError,
     ["num_heads"]),
    ("type-t5-heads-str", lambda: posenc_jax.get("t5", num_heads="2"), TypeError,
     ["num_heads"]),
    ("type-t5-buckets-float", lambda: posenc_jax.get("t5", num_heads=2, num_buckets=32.0),
     TypeError, ["num_buckets"]),
    ("type-shaw-k-float", lambda: posenc_jax.get("shaw", head_dim=8,
                                                 max_relative_position=4.0), TypeError,
     ["max_relative_position"]),
    ("type-learned-max-len-float", lambda: posenc_jax.get("learned", embed_dim=8,
                                                          max_len=16.0), TypeError,
     ["max_len"]),
    ("type-sinusoidal-dim-str", lambda: posenc_jax.get("sinusoidal", embed_dim="8"), TypeError,
     ["embed_dim"]),
    ("type-vocab-size-float", lambda: cfg(vocab_size=32.0), TypeError, ["vocab_size"]),
    ("type-num-layers-str", lambda: cfg(num_layers="1"), TypeError, ["num_layers"]),
    ("type-norm-eps-str", lambda: cfg(norm_eps="1e-6"), TypeError, ["norm_eps"]),
    ("type-block-size-float", lambda: cfg(block_size=64.0), TypeError, ["block_size"]),
    ("type-head-dim-bool", lambda: cfg(head_dim=True), TypeError, ["head_dim"]),
    ("type-max-new-tokens-float", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=2.0), TypeError, ["max_new_tokens"]),
    ("type-top-k-float", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, top_k=2.0, temperature=1.0,
        rng=jax.random.key(0)), TypeError, ["top_k"]),
    ("type-temperature-str", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, temperature="0"), TypeError, ["temperature"]),
    ("type-hf-rope-theta-str", lambda: hf(rope_theta="1e4"), TypeError, ["rope_theta"]),
    ("type-hf-config-list", lambda: hf_config.rope_kwargs_from_hf_config([1]), TypeError,
     ["config", "dict"]),
    ("type-encoding-kwargs-list", lambda: cfg(encoding_kwargs=[1, 2]), TypeError,
     ["encoding_kwargs", "dict"]),
    # -- sizes that are not positive ints
    ("size-vocab-zero", lambda: cfg(vocab_size=0), ValueError, ["vocab_size", ">= 1"]),
    ("size-heads-negative", lambda: cfg(num_heads=-2), ValueError, ["num_heads", ">= 1"]),
    ("size-mlp-zero", lambda: cfg(mlp_dim=0), ValueError, ["mlp_dim", ">= 1"]),
    ("size-block-zero", lambda: cfg(block_size=0), ValueError, ["block_size", ">= 1"]),
    ("size-kv-heads-not-dividing", lambda: cfg(num_kv_heads=3, num_heads=2, head_dim=8),
     ValueError, ["num_kv_heads"]),
    ("size-embed-not-divisible", lambda: cfg(embed_dim=15), ValueError,
     ["embed_dim=15", "num_heads=2"]),
    ("size-rope-head-dim-odd", lambda: rope_enc(head_dim=7), ValueError, ["rotary_dim"]),
    ("size-rope-rotary-too-big", lambda: rope_enc(rotary_dim=16), ValueError,
     ["rotary_dim", "head_dim=8"]),
    ("size-alibi-heads-zero", lambda: posenc_jax.get("alibi", num_heads=0), ValueError,
     ["num_heads", ">= 1"]),
    ("size-t5-buckets-one", lambda: posenc_jax.get("t5", num_heads=2, num_buckets=1),
     ValueError, ["num_buckets"]),
    ("size-t5-bidirectional-odd", lambda: posenc_jax.get("t5", num_heads=2, num_buckets=7,
                                                         bidirectional=True), ValueError,
     ["num_buckets", "even"]),
    ("size-shaw-k-zero", lambda: posenc_jax.get("shaw", head_dim=8, max_relative_position=0),
     ValueError, ["max_relative_position"]),
    ("size-learned-max-len-zero", lambda: posenc_jax.get("learned", embed_dim=8, max_len=0),
     ValueError, ["max_len"]),
    ("size-sinusoidal-odd", lambda: posenc_jax.get("sinusoidal", embed_dim=7), ValueError,
     ["dim", "even"]),
    ("size-max-new-tokens-zero", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=0), ValueError, ["max_new_tokens"]),
    ("size-top-k-too-big", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, top_k=33, temperature=1.0,
        rng=jax.random.key(0)), ValueError, ["top_k", "<= 32", "33"]),
    ("size-cache-batch-zero", lambda: kv_cache.init_cache(model(), 0, 8), ValueError,
     ["batch_size"]),
    ("size-cache-max-len-zero", lambda: kv_cache.init_cache(model(), 1, 0), ValueError,
     ["max_len"]),
    ("shape-sinusoidal-width", lambda: posenc_jax.get("sinusoidal", embed_dim=8).embed(
        {}, jnp.zeros((1, 4, 6)), POS), ValueError, ["embed_dim=8", "6"]),
    ("shape-learned-width", lambda: learned_embed(jnp.zeros((1, 4, 6))), ValueError,
     ["embed_dim=8", "6"]),
    ("shape-attend-rank", lambda: attend(q=jnp.zeros((4, 2, 8))), ValueError,
     ["q, k, v", "[B, L, heads, D]"]),
    ("shape-attend-kv-mismatch", lambda: attend(v=jnp.zeros((1, 4, 2, 4))), ValueError,
     ["k and v"]),
    ("shape-positions-length", lambda: attend(q_positions=jnp.arange(3)), ValueError,
     ["q_positions"]),
    ("shape-rope-x-rank", lambda: rope.apply(jnp.zeros((4, 8)), POS, rope.inv_freq(8)),
     ValueError, ["[..., L, H, D]"]),
    ("shape-tokens-1d", lambda: model()(jnp.zeros((4,), jnp.int32)), ValueError,
     ["tokens", "[B, L]"]),
    ("shape-prompt-empty", lambda: generate.generate(
        model(), jnp.zeros((1, 0), jnp.int32), max_new_tokens=1), ValueError, ["prompt"]),
    # -- dtypes
    ("dtype-attend-mixed", lambda: attend(k=QKV.astype(jnp.bfloat16),
                                          v=QKV.astype(jnp.bfloat16)), TypeError,
     ["q, k and v", "dtype", "bfloat16"]),
    ("dtype-attend-v-mixed", lambda: attend(v=QKV.astype(jnp.float16)), TypeError,
     ["dtype", "float16"]),
    ("dtype-tokens-float", lambda: model()(jnp.zeros((1, 4), jnp.float32)), ValueError,
     ["tokens", "int"]),
    ("dtype-learned-float-positions", lambda: learned.lookup(jnp.zeros((4, 2)),
                                                             jnp.zeros(2)), TypeError,
     ["positions", "integer"]),
    ("dtype-t5-float-positions", lambda: relative.relative_positions(jnp.zeros(2),
                                                                     jnp.arange(2)), TypeError,
     ["q_positions", "integer"]),
    ("dtype-model-dtype-int", lambda: cfg(dtype="int32"), ValueError, ["dtype", "float"]),
    # -- values out of range (positions, token ids, differences that would overflow)
    ("range-token-too-big", lambda: model()(tokens(1, 2, 32)), ValueError,
     ["token id", "32", "vocab_size=32"]),
    ("range-token-negative", lambda: model()(tokens(-1, 2)), ValueError,
     ["token id", "-1", "vocab_size=32"]),
    ("range-token-cached-decode", lambda: model()(tokens(40), cache=kv_cache.init_cache(
        model(), 1, 4)), ValueError, ["token id", "40", "vocab_size=32"]),
    ("range-generate-prompt-oov", lambda: generate.generate(
        model(), tokens(1, 99), max_new_tokens=1), ValueError, ["token id", "99"]),
    ("range-generate-past-learned-table", lambda: generate.generate(
        model(encoding="learned", encoding_kwargs={"max_len": 8}), tokens(1, 2, 3),
        max_new_tokens=6), ValueError, ["max_len=8", "9"]),
    ("range-learned-position", lambda: learned.lookup(jnp.zeros((4, 2)), jnp.asarray([4])),
     ValueError, ["position", "max_len=4"]),
    ("range-relative-int64", lambda: relative.relative_positions(
        np.asarray([2**40], np.int64), np.asarray([0], np.int64)), ValueError,
     ["positions", "int32"]),
    ("range-temperature-negative", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, temperature=-1.0), ValueError, ["temperature"]),
    ("range-partial-rotary-zero", lambda: rope_enc(partial_rotary_factor=0.0), ValueError,
     ["partial_rotary_factor"]),
    ("range-partial-rotary-big", lambda: rope_enc(partial_rotary_factor=1.5), ValueError,
     ["partial_rotary_factor"]),
    ("range-rope-base-zero", lambda: rope_enc(base=0.0), ValueError, ["base"]),
    ("range-sinusoidal-base-negative", lambda: sinusoidal.encode(POS, 8, base=-1.0),
     ValueError, ["base"]),
    # -- RoPE scaling dicts
    ("scaling-unknown-type", lambda: rope_enc(scaling={"rope_type": "magic"}), ValueError,
     ["rope_type", "magic", "yarn"]),
    ("scaling-factor-below-one", lambda: rope_enc(scaling={"rope_type": "linear",
                                                           "factor": 0.5}), ValueError,
     ["factor", ">= 1"]),
    ("scaling-linear-no-factor", lambda: rope_enc(scaling={"rope_type": "linear"}),
     ValueError, ["factor"]),
    ("scaling-yarn-betas-swapped", lambda: yarn(beta_fast=1.0, beta_slow=32.0), ValueError,
     ["beta_fast", "beta_slow"]),
    ("scaling-yarn-no-original", lambda: rope_enc(scaling={"rope_type": "yarn",
                                                           "factor": 2.0}), ValueError,
     ["original_max_position_embeddings"]),
    ("scaling-yarn-original-float", lambda: yarn(original_max_position_embeddings=64.5),
     TypeError, ["original_max_position_embeddings"]),
    ("scaling-longrope-length", lambda: rope_enc(scaling={**LONG, "short_factor": [1.0]}),
     ValueError, ["short_factor", "4"]),
    ("scaling-longrope-negative", lambda: rope_enc(scaling={
        **LONG, "long_factor": [1.0, -1.0, 1.0, 1.0]}), ValueError, ["long_factor[1]"]),
    ("scaling-llama3-low-above-high", lambda: rope_enc(scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
        "original_max_position_embeddings": 64}), ValueError,
     ["low_freq_factor", "high_freq_factor"]),
    ("scaling-partial-inside-conflicts", lambda: rope_enc(
        rotary_dim=8, scaling={"rope_type": "linear", "factor": 2.0,
                               "partial_rotary_factor": 0.5}), ValueError,
     ["partial_rotary_factor", "rotary_dim"]),
    ("scaling-type-disagree", lambda: rope_enc(scaling={"rope_type": "linear",
                                                        "type": "ntk", "factor": 2.0}),
     ValueError, ["rope_type", "type"]),
    ("scaling-function-factor-nan", lambda: rope_scaling.linear(rope.inv_freq(8),
                                                                factor=NAN), ValueError,
     ["factor", "finite"]),
    # -- Hugging Face configs
    ("hf-missing-dims", lambda: hf_config.rope_kwargs_from_hf_config({"rope_theta": 1e4}),
     ValueError, ["head_dim", "hidden_size"]),
    ("hf-scaling-str", lambda: hf(rope_scaling="yarn"), TypeError, ["rope_scaling"]),
    # -- model config
    ("model-unknown-encoding", lambda: cfg(encoding="magic"), ValueError, ["magic", "rope"]),
    ("model-unknown-activation", lambda: cfg(mlp_activation="relu"), ValueError,
     ["mlp_activation", "swiglu"]),
    ("model-unknown-attention", lambda: cfg(attention="flash"), ValueError,
     ["attention", "'flash'", "dense"]),
    ("model-layer-encodings-count", lambda: cfg(num_layers=2, layer_encodings=["rope"]),
     ValueError, ["layer_encodings", "num_layers=2"]),
    ("model-layer-encodings-additive", lambda: cfg(layer_encodings=["sinusoidal"]),
     ValueError, ["additive"]),
    ("model-unknown-kwarg", lambda: cfg(encoding_kwargs={"bass": 1.0}), ValueError,
     ["bass", "base"]),
    ("model-learned-input-too-long", lambda: model(
        encoding="learned", encoding_kwargs={"max_len": 4})(jnp.zeros((1, 6), jnp.int32)),
     ValueError, ["max_len=4"]),
    ("model-config-not-config", lambda: Transformer({"vocab_size": 3}, rngs=nnx.Rngs(0)),
     TypeError, ["TransformerConfig"]),
    # -- generate / sampling / cache
    ("generate-sampling-without-rng", lambda: generate.generate(
        model(), tokens(1), max_new_tokens=1, temperature=0.5), ValueError, ["rng"]),
    ("cache-overflow", lambda: model()(tokens(1, 2, 3, 4, 5), cache=kv_cache.init_cache(
        model(), 1, 4)), ValueError, ["cache", "4"]),
    ("cache-batch-mismatch", lambda: model()(jnp.zeros((2, 1), jnp.int32),
                                             cache=kv_cache.init_cache(model(), 1, 4)),
     ValueError, ["batch"]),
    ("attention-segments-one-sided", lambda: attend(q_segment_ids=POS), ValueError,
     ["q_segment_ids", "k_segment_ids"]),
    ("attention-heads-not-dividing", lambda: attend(k=jnp.zeros((1, 4, 3, 8)),
                                                    v=jnp.zeros((1, 4, 3, 8))), ValueError,
     ["num_heads", "num_kv_heads"]),
    ("attention-block-zero", lambda: attend(implementation="blockwise", block_q=0),
     ValueError, ["block_q"]),
    *[(f"attention-block-{impl}-{key}", lambda i=impl, k=key, v=v: attend(
        implementation=i, **{k: v}), ValueError, [f"{key} must be >= 1, got {key}={v}"])
      for impl, key, v in (("dense", "block_q", 0), ("pallas", "block_q", -5),
                           ("pallas", "block_k", 0))],  # issue 34: every backend checks
    ("attention-unknown-implementation", lambda: attend(implementation="magic"), ValueError,
     ["implementation", "'magic'"]),
    # -- issue 26: position dtypes and ranges, the cache, the HF readers, unclear errors
    *[(f"dtype-cache-{name}", lambda d=dtype: kv_cache.init_cache(model(), 1, 8, dtype=d),
       TypeError, ["dtype", "floating", name]) for name, dtype in (
           ("int8", jnp.int8), ("int16", jnp.int16), ("int32", jnp.int32),
           ("uint8", jnp.uint8), ("bool", jnp.bool_))],
    ("dtype-alibi-bool-positions", lambda: posenc_jax.get("alibi", num_heads=2).bias(
        {}, np.asarray([True, False]), np.asarray([True, False])), TypeError,
     ["q_positions", "dtype=bool", "not a position"]),
    ("range-alibi-int64-past-int32", lambda: posenc_jax.get("alibi", num_heads=2).bias(
        {}, np.asarray([0, 2**31 + 5]), np.asarray([0, 2**31 + 5])), ValueError,
     ["q_positions", "must fit in int32", "2147483653"]),
    ("dtype-cope-bool-positions", lambda: cope_bias(np.asarray([True])), TypeError,
     ["q_positions", "integer dtype", "bool"]),
    ("hf-rope-parameters-missing-a-layer-type", lambda: hf_config.rope_kwargs_from_hf_config(
        GEMMA3, layer_type="sliding_attention"), ValueError,
     ["layer_types", "'full_attention'", "rope_parameters' keys", "'sliding_attention'"]),
    ("hf-unknown-layer-type", lambda: hf_config.rope_kwargs_from_hf_config(
        {**GEMMA3, "rope_parameters": None,
         "layer_types": ["sliding_attention", "chunked_attention"]},
        layer_type="sliding_attention"), ValueError,
     ["layer_types", "'chunked_attention'", "at layer 1", "gemma3"]),
    ("hf-yarn-alone-is-not-factor-one", lambda: hf(rope_scaling={"rope_type": "yarn"}),
     ValueError, ["'yarn'", "no factor given", "128 / 128", "= 1", "give factor"]),
    ("hf-inferred-factor-says-inferred", lambda: hf(rope_scaling={
        "rope_type": "yarn", "original_max_position_embeddings": 256}), ValueError,
     ["no factor given", "max_position_embeddings / original_max_position_embeddings",
      "128 / 256 = 0.5 < 1"]),
    ("hf-config-kwargs-partial-linear-llama", lambda: hf_config.transformer_config_kwargs(
        {**LLAMA, "partial_rotary_factor": 0.5,
         "rope_scaling": {"rope_type": "linear", "factor": 2.0}}), ValueError,
     ["model_type='llama'", "whole head dim 64", "rotary dim 32", "transformers fails"]),
    ("hf-config-kwargs-mla-without-model-type", lambda: hf_config.transformer_config_kwargs(
        {k: v for k, v in {**LLAMA, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32}.items()
         if k != "model_type"}), ValueError,
     ["MLA keys", "qk_nope_head_dim=32", "deepseek_v3"]),
    ("model-mrope-beside-rope", lambda: cfg(num_layers=2, encoding="nope", layer_encodings=[
        ("mrope", {"mrope_section": (2, 1, 1)}), "rope"]), ValueError,
     ["different axes [1, 3]", "one positions shape"]),
    ("cache-from-another-config", lambda: jitted_step(model(), tokens(1, 2), kv_cache.init_cache(
        model(embed_dim=32), 1, 8)), ValueError,
     ["head dim 16", "head_dim=8", "another config", "init_cache"]),
    ("cache-more-tokens-than-slots", lambda: jitted_step(model(), tokens(1, 2, 3, 4, 5, 6),
                                                         kv_cache.init_cache(model(), 1, 4)),
     ValueError, ["6 new tokens", "max_len=4"]),
    ("generate-rng-str", lambda: generate.generate(model(), tokens(1), max_new_tokens=1,
                                                   rng="0", temperature=1.0), TypeError,
     ["rng", "PRNG key", "int seed", "'0'"]),
    ("generate-rng-float", lambda: generate.generate(model(), tokens(1), max_new_tokens=1,
                                                     rng=0.5, temperature=1.0), TypeError,
     ["rng", "PRNG key", "float"]),
]


@pytest.mark.parametrize(("call", "exc", "words"), [row[1:] for row in LIBRARY],
                         ids=[row[0] for row in LIBRARY])
def test_library_refuses_by_name(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing}: {message!r}"


def test_bad_values_that_now_work_instead():
    """Three rows of the issue that are fixed by computing the right thing, not by refusing:
    blockwise attention over L = 0 is empty like dense; unsigned positions give ALiBi the
    same bias as int32 ones (k - q no longer wraps); a tiny temperature samples the argmax."""
    empty = jnp.zeros((1, 0, 2, 8))
    nothing = jnp.zeros((0,), jnp.int32)
    for implementation in ("dense", "blockwise"):
        out = attend(q=empty, k=empty, v=empty, q_positions=nothing, k_positions=nothing,
                     implementation=implementation)
        assert out.shape == (1, 0, 2, 8)
    alibi = posenc_jax.get("alibi", num_heads=2)
    pos = np.asarray([0, 5, 2**31 + 7], np.uint32)
    unsigned = alibi.bias({}, pos, pos)
    assert float(jnp.min(unsigned)) > -2.0**32 and float(jnp.max(unsigned)) == 0.0
    small = np.asarray([0, 3, 9], np.int32)
    np.testing.assert_array_equal(alibi.bias({}, small.astype(np.uint32), small.astype(
        np.uint32)), alibi.bias({}, small, small))
    logits = jnp.asarray([[0.0, 1.0, 0.5], [3.0, -1.0, 2.9]])
    got = generate.sample(logits, jax.random.key(0), temperature=1e-40, top_k=None)
    np.testing.assert_array_equal(got, jnp.argmax(logits, axis=-1))


def test_an_int_seed_is_a_prng_key():
    m = model()
    np.testing.assert_array_equal(
        generate.generate(m, tokens(1, 2), max_new_tokens=3, rng=7, temperature=1.0),
        generate.generate(m, tokens(1, 2), max_new_tokens=3, rng=jax.random.key(7),
                          temperature=1.0))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_t5_far_key_at_the_int32_limits_is_never_near(bidirectional):
    """k - q of a query at 2^31 - 1 and a key at -2^31 + 5 wrapped to a near, 'future'
    distance; it gets the bucket of any far past key now (and the mirror case a far future)."""
    enc = posenc_jax.get("t5", num_heads=2, bidirectional=bidirectional)
    params = enc.init(jax.random.key(0))
    big = np.iinfo(np.int32).max

    def bias(q, k):
        return np.asarray(enc.bias(params, np.asarray([q], np.int32), np.asarray([k], np.int32)))

    np.testing.assert_array_equal(bias(big, -big + 4), bias(0, -10**6))
    np.testing.assert_array_equal(bias(big, -big - 1), bias(0, -10**6))
    if bidirectional:
        np.testing.assert_array_equal(bias(-big + 4, big), bias(0, 10**6))


def test_relative_positions_saturate_instead_of_wrapping():
    """int32 k - q near the limits: the T5 bucket of a huge distance is the last one, not a
    wrapped 'future' bucket."""
    big = np.iinfo(np.int32).max
    q = jnp.asarray([-big, big], jnp.int32)
    k = jnp.asarray([big, -big], jnp.int32)
    rel = relative.relative_positions(q, k)
    assert int(rel[0, 0]) == big and int(rel[1, 1]) == np.iinfo(np.int32).min  # saturated
    assert int(rel[0, 1]) == 0 and int(rel[1, 0]) == 0


def test_traced_token_ids_give_nan_not_a_wrapped_row_and_checked_ids_raise():
    m = model()
    bad = jnp.asarray([[1, -1]], jnp.int32)
    logits = nnx.jit(lambda mod, t: mod(t))(m, bad)
    assert bool(jnp.isnan(logits).all())  # never the embedding of id V - 1

    def checked(t):
        return posenc_jax.checks.checked_token_ids("tokens", t, vocab_size=32)

    err, _ = jax.jit(checkify.checkify(checked))(bad)
    with pytest.raises(Exception, match=r"token id -1 in tokens is outside the vocabulary"):
        err.throw()


def test_table_covers_the_categories_and_is_large():
    categories = {row[0].split("-")[0] for row in LIBRARY + CONFIG + CLI + WORKDIR}
    assert len(LIBRARY) + len(CONFIG) + len(CLI) + len(WORKDIR) >= 190
    assert {"bool", "nonfinite", "type", "size", "shape", "dtype", "range", "scaling", "hf",
            "config", "cli"} <= categories
    ids = [row[0] for row in LIBRARY + CONFIG + CLI + WORKDIR]
    assert len(ids) == len(set(ids))


# -- the trainer's config, checked in process before anything runs -------------------------

def tiny(**overrides):
    spec = importlib.util.spec_from_file_location("cfg_tiny", ROOT / "configs" / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.eval.lengths = ()
    config.mesh.data = 1
    for key, value in overrides.items():
        target = config
        *path, last = key.split(".")
        for part in path:
            target = target[part]
        with target.ignore_type():
            target[last] = value
    return config


CONFIG = [
    ("config-checkpoints-to-keep-zero", {"checkpoints_to_keep": 0}, ValueError,
     ["config.checkpoints_to_keep", ">= 1"]),
    ("config-eval-length-zero", {"eval.lengths": (0,)}, ValueError,
     ["config.eval.lengths[0]", ">= 1"]),
    ("config-eval-lengths-int", {"eval.lengths": 32}, TypeError, ["config.eval.lengths"]),
    ("config-learned-eval-past-table", {"model.encoding": "learned",
                                        "model.encoding_kwargs": {"max_len": 32},
                                        "eval.lengths": (32, 64)}, ValueError,
     ["config.eval.lengths[1]=64", "32 positions"]),
    ("config-learned-seq-past-table", {"model.encoding": "learned",
                                       "model.encoding_kwargs": {"max_len": 16}}, ValueError,
     ["config.seq_len=32", "16 positions"]),
    ("config-lr-nan", {"learning_rate": NAN}, ValueError, ["config.learning_rate", "finite"]),
    ("config-lr-str", {"learning_rate": "1e-3"}, TypeError, ["config.learning_rate"]),
    ("config-lr-negative", {"learning_rate": -1.0}, ValueError, ["config.learning_rate"]),
    ("config-b2-one", {"adam_b2": 1.0}, ValueError, ["config.adam_b2", "< 1"]),
    ("config-eps-zero", {"adam_eps": 0.0}, ValueError, ["config.adam_eps", "> 0"]),
    ("config-clip-inf", {"grad_clip_norm": INF}, ValueError, ["config.grad_clip_norm"]),
    ("config-min-lr-ratio", {"min_lr_ratio": 2.0}, ValueError, ["config.min_lr_ratio"]),
    ("config-weight-decay-nan", {"weight_decay": NAN}, ValueError, ["config.weight_decay"]),
    ("config-warmup-negative", {"warmup_steps": -1}, ValueError, ["config.warmup_steps"]),
    ("config-steps-zero", {"num_train_steps": 0}, ValueError, ["config.num_train_steps"]),
    ("config-batch-float", {"batch_size": 8.0}, TypeError, ["config.batch_size"]),
    ("config-accum-not-dividing", {"grad_accum_steps": 3}, ValueError,
     ["config.grad_accum_steps=3", "config.batch_size=8"]),
    ("config-eval-every-negative", {"eval_every_steps": -5}, ValueError,
     ["config.eval_every_steps"]),
    ("config-async-str", {"async_checkpointing": "False"}, TypeError,
     ["config.async_checkpointing", "bool"]),
    ("config-packed-str", {"dataset.packed": "yes"}, TypeError, ["config.dataset.packed"]),
    ("config-mesh-zero", {"mesh.data": 0}, ValueError, ["config.mesh.data"]),
    ("config-mesh-str", {"mesh.fsdp": "2"}, TypeError, ["config.mesh.fsdp"]),
    ("config-eval-tokens-zero", {"eval.num_tokens": 0}, ValueError, ["config.eval.num_tokens"]),
    ("config-model-causal-str", {"model.causal": "False"}, TypeError,
     ["config.model", "causal"]),
    ("config-model-heads-zero", {"model.num_heads": 0}, ValueError,
     ["config.model", "num_heads"]),
    ("config-seed-float", {"seed": 0.5}, TypeError, ["config.seed"]),
    # issue 34: what context parallelism cannot run, with the real conflict
    ("config-cope-context", {"mesh.context": 2, "model.encoding": "cope"}, ValueError,
     ["config.model.encoding='cope' reads whole rows of attention logits (a RowBias), but "
      "config.mesh.context=2 splits every row's keys over devices"]),
    ("config-cudnn-context-cpu", {"mesh.context": 2, "model.attention": "cudnn"}, ValueError,
     ["config.model.attention='cudnn' does not lower for this platform 'cpu' (only ['cuda']);"
      " with config.mesh.context=2 the context-parallel steps would have replaced it"]),
]


@pytest.mark.parametrize(("overrides", "exc", "words"), [row[1:] for row in CONFIG],
                         ids=[row[0] for row in CONFIG])
def test_trainer_refuses_bad_settings_before_anything_runs(overrides, exc, words, tmp_path):
    from train import trainer

    workdir = tmp_path / "never"
    with pytest.raises(exc) as info:
        trainer.train_and_evaluate(tiny(**overrides), str(workdir))
    message = str(info.value)
    assert not [w for w in words if w not in message], message
    assert not workdir.exists()  # refused before touching the workdir


WORKDIR = [  # (id, the workdir, relative to tmp_path; words): refused before any write
    ("config-workdir-empty", "", ["workdir must be a non-empty path", "current directory"]),
    ("config-workdir-a-file", "a_file", ["a_file is a file", "not a directory"]),
    ("config-workdir-under-a-file", "a_file/run", ["is under", "a_file, which is a file"]),
]


@pytest.mark.parametrize(("workdir", "words"), [row[1:] for row in WORKDIR],
                         ids=[row[0] for row in WORKDIR])
def test_trainer_refuses_a_workdir_that_is_no_directory(workdir, words, tmp_path,
                                                        monkeypatch):
    from train import trainer
    from train.workdir_lock import WorkdirError

    (tmp_path / "a_file").write_text("x")
    monkeypatch.chdir(tmp_path)  # '' would be this directory
    with pytest.raises(WorkdirError) as info:
        trainer.train_and_evaluate(tiny(), str(tmp_path / workdir) if workdir else "")
    assert not [w for w in words if w not in str(info.value)], str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


# -- the command line ----------------------------------------------------------------------

CLI = [
    ("cli-checkpoints-to-keep-zero", ["--config.checkpoints_to_keep=0"],
     ["config.checkpoints_to_keep", ">= 1"]),
    ("cli-eval-lengths-zero", ["--config.eval.lengths=(0,)"], ["config.eval.lengths[0]"]),
    ("cli-learned-past-table", ["--config.model.encoding=learned",
                                "--config.eval.lengths=(64,)"],
     ["config.eval.lengths[0]=64"]),
    ("cli-lr-nan", ["--config.learning_rate=nan"], ["config.learning_rate", "finite"]),
    ("cli-causal-typo", ["--config.model.causal=Flase"], ["causal"]),
    ("cli-unknown-key", ["--config.modle.causal=False"], ["modle"]),
    ("cli-no-workdir", None, ["workdir"]),
    # issue 26: one line naming the key, no traceback (ONE_LINE)
    ("cli-unknown-key-close-match", ["--config.mesh.dta=2"],
     ["--config.mesh.dta", "config.mesh has no key 'dta'", "did you mean 'data'"]),
    ("cli-study-key-on-the-trainer", ["--config.workers=2"],
     ["--config.workers", "config has no key 'workers'", "num_train_steps"]),
    ("cli-workdir-empty", ["--workdir="], ["workdir must be a non-empty path"]),
    ("cli-workdir-a-file", ["--workdir=README.md"], ["README.md is a file", "not a directory"]),
    ("cli-encoding-kwargs-settable", ["--config.model.encoding=learned",
                                      "--config.model.encoding_kwargs.max_len=16"],
     ["config.seq_len=32", "16 positions"]),
    ("cli-kwargs-block-typo", ["--config.model.encodng_kwargs.max_len=16"],
     ["no key 'encodng_kwargs'", "'encoding_kwargs'"]),
]
ONE_LINE = {"cli-unknown-key-close-match", "cli-study-key-on-the-trainer", "cli-workdir-empty",
            "cli-workdir-a-file", "cli-kwargs-block-typo", "cli-unknown-key", "cli-causal-typo"}


# One process runs every row: it imports what `python -m train` imports (JAX, absl, the
# trainer) once, then forks a child per row that runs `python -m train` itself (runpy, as
# __main__: its flags defined afresh, the parent never parsed any) and ends as that command
# would: an uncaught exception or SystemExit leaves the child through the interpreter (its
# message or traceback on stderr, its exit status). Each row's stderr is a file of its own.
DRIVER = r"""
import json, os, runpy, sys
import absl.app, ml_collections.config_flags
from train import cli, sharding, trainer, xla_flags

results = {}
for row_id, argv, home, err_path in json.loads(sys.argv[1]):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.environ["HOME"] = home
        os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.argv = argv
        runpy.run_module("train", run_name="__main__", alter_sys=True)
        sys.exit(0)
    results[row_id] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def learned_tiny_config(tmp_path_factory):
    """configs/tiny.py with a learned table of 32 positions (a file the CLI can load)."""
    path = tmp_path_factory.mktemp("cfg") / "tiny_learned.py"
    path.write_text("from configs import tiny\n\n\ndef get_config():\n"
                    "    config = tiny.get_config()\n"
                    "    config.model.encoding_kwargs = {'max_len': 32}\n"
                    "    return config\n")
    return path


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, learned_tiny_config):
    """{row id: (its folder, exit status, stderr)} of every CLI row, run by DRIVER."""
    rows, folders = [], {}
    for row_id, flags, _ in CLI:
        folder = folders[row_id] = tmp_path_factory.mktemp(row_id)
        config = learned_tiny_config if "learned" in " ".join(flags or []) else \
            ROOT / "configs" / "tiny.py"
        argv = ["train", f"--config={config}"]
        if flags is not None:
            own = any(f.startswith("--workdir=") for f in flags)
            argv += [*([] if own else [f"--workdir={folder / 'w'}"]), *flags]
        rows.append((row_id, argv, str(folder), str(folder / "stderr")))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "HOME": str(tmp_path_factory.mktemp("home"))}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(rows)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    codes = json.loads(lines[0][len("RESULTS "):])
    return {row_id: (folders[row_id], codes[row_id], (folders[row_id] / "stderr").read_text())
            for row_id, *_ in CLI}


@pytest.mark.parametrize(("row_id", "flags", "words"), CLI, ids=[row[0] for row in CLI])
def test_cli_refuses_by_name(row_id, flags, words, cli_runs):
    folder, returncode, stderr = cli_runs[row_id]
    assert returncode != 0
    missing = [w for w in words if w not in stderr]
    assert not missing, f"stderr lacks {missing}:\n{stderr[-2000:]}"
    assert not (folder / "w").exists()
    if row_id in ONE_LINE:
        assert "Traceback" not in stderr and stderr.strip().startswith("error: "), (
            stderr[-2000:])

"""The kernel section of the prepared device run (`benchmarks/device_check.py`, section
"kernel"): the Pallas kernel at the head dims of SmolLM2 (64), Phi-3 (96) and Gemma 3 (256),
Gemma 3's sliding-window layers (window 512) against full attention at 32k, gpt-oss's learned
sinks (64 heads over 8, D = 64; window 128 and full) and Llama 4's chunked layers (40 heads
over 8, D = 128, chunk 8192) against full attention at 32k, and a sweep of the GPU block
sizes.

Each entry: forward and forward+backward times (`device_sections.timed`: median after a
compile and a warm-up), attention TFLOP/s counted as causal (half of 4 B H L^2 D forward,
2.5x that for forward+backward), and the error against float32 dense XLA at a short length.
Every entry catches its own failure and the section stops starting entries past `deadline`.

    python benchmarks/kernel_device.py --smoke     # CPU, interpret mode, tiny shapes

Shapes: B batch, L length, H query heads, K kv heads, D head dim.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

from device_sections import error_text, timed
from posenc_jax.encodings import base as enc_base
from posenc_jax.model import attention as attention_lib
from posenc_jax.model.kernels import flash_attention

FULL = {"dims": {"smollm2": (64, 9, 3), "phi3": (96, 32, 32), "gemma3": (256, 4, 1)},
        "length": 8192, "check_length": 512, "window_length": 32768, "window": 512,
        "sweep_dim": 128, "sweep": [(64, 64, 4), (128, 64, 4), (128, 64, 8), (64, 32, 4),
                                    (128, 128, 8), (64, 128, 4)], "reps": 3}
SMOKE = {"dims": {"smollm2": (64, 2, 1), "phi3": (96, 2, 2), "gemma3": (256, 2, 1)},
         "length": 32, "check_length": 32, "window_length": 64, "window": 16,
         "sweep_dim": 32, "sweep": [(16, 16, 4)], "reps": 1}
# Issue 31's layers at 32k: (name, (D, H, K), attend kwargs -> keys each query sees).
FULL["new"] = {"length": 32768, "gpt_oss": (64, 64, 8), "sink_window": 128,
               "llama4": (128, 40, 8), "chunk": 8192}
SMOKE["new"] = {"length": 64, "gpt_oss": (64, 4, 2), "sink_window": 8, "llama4": (32, 4, 2),
                "chunk": 16}


def _inputs(length, h, kv, d, dtype=jnp.bfloat16):
    ks = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(ks[0], (1, length, h, d)).astype(dtype),
            jax.random.normal(ks[1], (1, length, kv, d)).astype(dtype),
            jax.random.normal(ks[2], (1, length, kv, d)).astype(dtype))


def _kernel(d, window=None, blocks=None, **local):
    """(f(q, k, v) with the kernel, the rope encoding); `local`: chunk_size, sinks."""
    enc = enc_base.get("rope", head_dim=d)
    rotation = enc.kernel_rotation({})

    def f(q, k, v):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)[None]
        return flash_attention(q, k, v, encoding=enc, params={}, q_positions=pos,
                               k_positions=pos, causal=True, rotation=rotation, window=window,
                               blocks=blocks, block_q=16, block_k=16, **local)
    return f, enc


def _dense(enc, q, k, v, window=None):
    pos = jnp.arange(q.shape[1], dtype=jnp.int32)
    q, k = enc.rotate({}, q, k, pos, pos)
    if window is None:
        return attention_lib.attend(q, k, v, encoding=enc, params={}, q_positions=pos,
                                    k_positions=pos, causal=True, implementation="dense")
    b, lq, h, d = q.shape
    rep = jnp.repeat(k, h // k.shape[2], 2), jnp.repeat(v, h // v.shape[2], 2)
    return jax.nn.dot_product_attention(q, *rep, is_causal=True, implementation="xla",
                                        local_window_size=(window - 1, 0))


def _reference(enc, q, k, v, **local):
    """Dense XLA attention (float32) with the window / chunk / sinks of `local`."""
    pos = jnp.arange(q.shape[1], dtype=jnp.int32)
    q, k = enc.rotate({}, q, k, pos, pos)
    return attention_lib.attend(q, k, v, encoding=enc, params={}, q_positions=pos,
                                k_positions=pos, causal=True, implementation="dense", **local)


def _new_layers(new: dict, check_length: int) -> list:
    """(entry name, (L, H, K, D), kernel kwargs, keys each query sees) of issue 31's layers."""
    length, w, c = new["length"], new["sink_window"], new["chunk"]
    d, h, kv = new["gpt_oss"]
    sinks = jnp.linspace(-1.0, 1.0, h, dtype=jnp.float32)
    rows = [(f"gpt_oss_sinks/L={length}/window={w}+sinks", (length, h, kv, d),
             {"window": w, "sinks": sinks}, min(w, length)),
            (f"gpt_oss_sinks/L={length}/full+sinks", (length, h, kv, d), {"sinks": sinks},
             length / 2)]
    d, h, kv = new["llama4"]
    rows += [(f"llama4_chunked/L={length}/chunk={c}", (length, h, kv, d), {"chunk_size": c},
              min(c, length) / 2),
             (f"llama4_chunked/L={length}/full", (length, h, kv, d), {}, length / 2)]
    return [(name, shape, kw, keys, check_length) for name, shape, kw, keys in rows]


def _fwd_bwd(fn):
    def f(q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(jnp.ones_like(out))
    return f


def _row(fn, shape, reps, causal_flops):
    q, k, v = _inputs(*shape)
    fwd, both = timed(fn, q, k, v, reps=reps), timed(_fwd_bwd(fn), q, k, v, reps=reps)
    return {"shape": list(shape), "fwd_ms": fwd["median_s"] * 1e3,
            "fwd_bwd_ms": both["median_s"] * 1e3,
            "fwd_TFLOPs": causal_flops / fwd["median_s"] / 1e12,
            "fwd_bwd_TFLOPs": 3.5 * causal_flops / both["median_s"] / 1e12,
            "compile_s": fwd["compile_s"] + both["compile_s"], "memory_gib": both["memory_gib"]}


def run(shapes: dict, out, deadline: float) -> None:
    """All entries of the section (see module doc); `shapes` is FULL or SMOKE."""
    def entry(name, make):
        if time.time() > deadline:
            out(name, {"status": "skipped", "reason": "section time budget spent"})
            return
        try:
            out(name, {"status": "ok", **make()})
        except Exception as e:  # noqa: BLE001 -- recorded: one entry never stops the rest
            out(name, {"status": "error", "error": error_text(e)})

    reps = shapes["reps"]
    # issue 31's sinks and chunks first: the first H200 run (docs/device/) spent the
    # section's budget on Gemma 3's D = 256 backward before reaching them
    for name, shape, kw, keys, n in _new_layers(shapes["new"], shapes["check_length"]):
        def make(shape=shape, kw=kw, keys=keys, n=n):
            length, h, kv, d = shape
            fn, enc = _kernel(d, **kw)
            check = {**kw, **({"chunk_size": max(n // 4, 1)} if "chunk_size" in kw else {})}
            q, k, v = _inputs(n, h, kv, d, jnp.float32)     # checked with chunks inside n
            err = float(jnp.max(jnp.abs(jax.jit(_kernel(d, **check)[0])(q, k, v)
                                        - _reference(enc, q, k, v, **check))))
            row = _row(fn, shape, reps, 4 * h * length * keys * d)
            return {**row, "max_err_f32_vs_dense": err, "settings": sorted(kw)}
        entry(name, make)

    for model, (d, h, kv) in shapes["dims"].items():
        def make(d=d, h=h, kv=kv):
            fn, enc = _kernel(d)
            n = shapes["check_length"]
            q, k, v = _inputs(n, h, kv, d, jnp.float32)
            err = float(jnp.max(jnp.abs(jax.jit(fn)(q, k, v) - _dense(enc, q, k, v))))
            length = shapes["length"]
            row = _row(fn, (length, h, kv, d), reps, 2 * h * length * length * d)
            return {**row, "max_err_f32_vs_dense": err, "check_length": n}
        entry(f"kernel/{model}/D={d}", make)

    d, h, kv = shapes["dims"]["gemma3"]
    length, window = shapes["window_length"], shapes["window"]
    for name, win in (("full", None), (f"window={window}", window)):
        def make(win=win):
            fn, enc = _kernel(d, win)
            q, k, v = _inputs(shapes["check_length"], h, kv, d, jnp.float32)
            err = float(jnp.max(jnp.abs(jax.jit(fn)(q, k, v) - _dense(enc, q, k, v, win))))
            keys = length / 2 if win is None else min(win, length)       # keys per query
            row = _row(fn, (length, h, kv, d), reps, 4 * h * length * keys * d)
            return {**row, "max_err_f32_vs_dense": err, "window": win}
        entry(f"gemma3_sliding/L={length}/{name}", make)

    d = shapes["sweep_dim"]
    for bq, bk, warps in shapes["sweep"]:
        blocks = {"gpu": {"block_q": bq, "block_k": bk, "block_q_dq": bq, "block_k_dq": bk,
                          "block_q_dkv": bq, "block_k_dkv": bk, "num_warps": warps}}
        entry(f"sweep/D={d}/{bq}x{bk}/warps={warps}",
              lambda blocks=blocks: _row(_kernel(d, blocks=blocks)[0],
                                         (shapes["length"], 8, 2, d), reps,
                                         2 * 8 * shapes["length"] ** 2 * d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU: interpret)")
    args = parser.parse_args()
    rows = {}
    run(SMOKE if args.smoke else FULL, lambda k, v: rows.__setitem__(k, v),
        time.time() + (300 if args.smoke else 600))
    print(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()

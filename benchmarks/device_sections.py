"""The sections of `benchmarks/device_check.py`, each a function `(shapes, out) -> None`.

Every section writes its results through `out(key, value)` as it goes (so a timeout or a
crash keeps what was measured) and catches the failure of each entry on its own: an
implementation that is missing, does not compile or runs out of memory is recorded as such.
Times are medians of `reps` runs after a compile and one warm-up; memory is the compiled
program's own account (arguments + outputs + temporaries, `memory_analysis()`).

Shapes: B batch, L length, H heads, D head dim.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import traceback
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.encodings import base as enc_base
from posenc_jax.encodings import frequencies
from posenc_jax.encodings import rope as rope_lib
from posenc_jax.model import attention as attention_lib

Out = Callable[[str, object], None]
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of the H100/H200 SXM spec sheet


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def timed(fn, *args, reps: int) -> dict:
    """Compile, warm up, time `reps` calls: {compile_s, median_s, min_s, memory_gib}."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    mem = None
    try:
        m = compiled.memory_analysis()
        mem = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes) / 2**30
    except Exception:  # noqa: BLE001, S110 -- not every backend reports it
        pass
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t)
    return {"compile_s": compile_s, "median_s": statistics.median(times), "min_s": min(times),
            "memory_gib": mem}


def platform_info() -> dict:
    dev = jax.devices()[0]
    return {"platform": dev.platform, "device": getattr(dev, "device_kind", str(dev)),
            "jax_version": jax.__version__, "device_count": jax.device_count()}


def has_pallas() -> bool:
    return "pallas" in attention_lib.IMPLEMENTATIONS


# -- attention implementations, all [B, L, H, D] bf16 -> [B, L, H, D] -------------------

def attention_fns(h: int, block: int) -> dict[str, Callable | str]:
    """name -> f(q, k, v), or a string saying why it is not available here."""
    alibi = enc_base.get("alibi", num_heads=h)
    on_gpu = jax.devices()[0].platform == "gpu"

    def ours(impl):
        def f(q, k, v):
            pos = jnp.arange(q.shape[1], dtype=jnp.int32)
            return attention_lib.attend(q, k, v, encoding=alibi, params={}, q_positions=pos,
                                        k_positions=pos, causal=True, implementation=impl,
                                        block_q=block, block_k=block)
        return f

    def cudnn_no_bias(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def xla_no_bias(q, k, v):  # cudnn(no bias)'s reference: the same attention, no ALiBi
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    cudnn_no_bias.reference = xla_no_bias

    no_gpu = "needs a GPU (cuDNN)"
    return {  # the order entries run in: the cheap references first
        "xla-dense+alibi": ours("dense"),
        "blockwise+alibi": ours("blockwise"),
        "pallas+alibi": ours("pallas") if has_pallas() else
        "not available: this checkout has no attention='pallas' (issue 11)",
        "cudnn(no bias)": cudnn_no_bias if on_gpu else no_gpu,
        "cudnn+alibi(materialised)": ours("cudnn") if on_gpu else no_gpu,
    }


def _qkv(b, l, h, d, dtype=jnp.bfloat16, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (b, l, h, d), jnp.float32).astype(dtype) for k in ks]


def _fwd_bwd(fn):
    def f(q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(jnp.ones_like(out))
    return f


# -- sections ---------------------------------------------------------------------------

def numerics(shapes: dict, out: Out) -> None:
    """Each implementation in bfloat16 against float32 dense XLA: output and dq/dk/dv."""
    b, l, h, d = shapes["numerics"]
    q, k, v = _qkv(b, l, h, d)
    fns = attention_fns(h, shapes["block"])
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    wants = {}  # reference name -> its float32 output and gradients, computed once
    for name, fn in fns.items():
        if isinstance(fn, str):
            out(name, {"status": "skipped", "reason": fn})
            continue
        try:  # float32 dense with ALiBi, or the entry's own `reference` (cuDNN without bias)
            ref = getattr(fn, "reference", fns["xla-dense+alibi"])
            if ref.__name__ not in wants:
                wants[ref.__name__] = jax.jit(_fwd_bwd(ref))(*f32)
            want = wants[ref.__name__]
            scale = [float(jnp.max(jnp.abs(w))) + 1e-6 for w in jax.tree.leaves(want)]
            t = time.perf_counter()
            got = jax.jit(_fwd_bwd(fn))(q, k, v)
            jax.block_until_ready(got)
            errs = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - w))) / s
                    for g, w, s in zip(jax.tree.leaves(got), jax.tree.leaves(want), scale)]
            ok = errs[0] < 2e-2 and max(errs[1:]) < 5e-2
            out(name, {"status": "pass" if ok else "FAIL", "rel_err_out": errs[0],
                       "rel_err_grads": errs[1:], "compile_and_run_s": time.perf_counter() - t,
                       "shape": [b, l, h, d], "dtype": "bfloat16"})
        except Exception as e:  # noqa: BLE001 -- recorded: one entry never stops the rest
            out(name, {"status": "error", "error": error_text(e)})


def rope(shapes: dict, out: Out) -> None:
    """RoPE apply against a plain scaled copy of the same array (bandwidth fraction)."""
    b, l, h, d = shapes["rope"]
    x = jax.random.normal(jax.random.key(0), (b, l, h, d), jnp.float32).astype(jnp.bfloat16)
    pos = jnp.arange(l, dtype=jnp.int32)
    inv = frequencies.inv_freq(d)
    moved = 2 * x.size * x.dtype.itemsize
    copy = timed(lambda x, s: x * s, x, jnp.asarray(1.5, x.dtype), reps=shapes["reps"])
    rot = timed(lambda x: rope_lib.apply(x, pos, inv), x, reps=shapes["reps"])
    out("shape", [b, l, h, d])
    out("copy_GBps", moved / copy["median_s"] / 1e9)
    out("rope_GBps", moved / rot["median_s"] / 1e9)
    out("fraction_of_copy", copy["median_s"] / rot["median_s"])
    out("times", {"copy": copy, "rope": rot})


def attention(shapes: dict, out: Out) -> None:
    """The attention table of issue 11 (`benchmarks/attention_device.py`), row by row."""
    try:
        import attention_device
    except ImportError as e:
        out("status", f"not available: benchmarks/attention_device.py ({error_text(e)})")
        return

    def log(line: str) -> None:
        row = json.loads(line)
        out(f"L={row['L']}/{row['method']}/{row['encoding']}", row)

    result = attention_device.run(smoke=shapes["smoke"], iters=shapes["reps"], log=log)
    out("config", result["config"])


def matmul_peak(n: int, reps: int) -> float:
    a = jnp.ones((n, n), jnp.bfloat16)
    r = timed(lambda a, b: a @ b, a, a, reps=reps)
    return 2 * n**3 / r["median_s"]


def train(shapes: dict, out: Out, deadline: float) -> None:
    """Train-step tokens/s and MFU of our stack (AdamW, scan over layers) per attention."""
    from train_throughput import model_flops_per_token

    from configs import default
    from train import sharding
    from train import state as state_lib
    from train import step as step_lib

    m, (batch, length) = shapes["train_model"], shapes["train_batch"]
    peak = matmul_peak(shapes["matmul_n"], shapes["reps"])
    out("matmul_bf16_TFLOPs", peak / 1e12)
    on_gpu = jax.devices()[0].platform == "gpu"
    variants = {"cudnn-dense" if on_gpu else "xla-dense":
                {"attention": "cudnn" if on_gpu else "dense"}}
    variants["pallas"] = {"attention": "pallas"} if has_pallas() else None
    for name, over in variants.items():
        if over is None:
            out(name, {"status": "skipped", "reason": "no attention='pallas' here (issue 11)"})
            continue
        if time.time() > deadline:
            out(name, {"status": "skipped", "reason": "section time budget spent"})
            continue
        try:
            config = default.get_config()
            config.batch_size, config.seq_len, config.warmup_steps = batch, length, 10
            config.model.update(**m, dtype="bfloat16", param_dtype="float32", scan_layers=True,
                                **over)
            mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
            setup = state_lib.make_setup(config, mesh)
            step = step_lib.make_train_step(setup)
            flops, n_matmul, n_total = model_flops_per_token(setup, length)
            rng = np.random.default_rng(0)
            toks = rng.integers(0, 256, (batch, length + 1), dtype=np.int32)
            data = jax.device_put({
                "inputs": toks[:, :-1], "targets": toks[:, 1:],
                "positions": np.tile(np.arange(length, dtype=np.int32), (batch, 1)),
                "segment_ids": np.zeros((batch, length), np.int32),
                "weights": np.ones((batch, length), np.float32)})
            t = time.perf_counter()
            state = state_lib.init_state(setup, seed=0)
            state, metrics = step(state, data)
            loss0 = float(metrics["loss"])
            compile_s = time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(shapes["train_steps"]):
                state, metrics = step(state, data)
            loss = float(metrics["loss"])  # one host read for all the timed steps
            sec = (time.perf_counter() - t) / shapes["train_steps"]
            tps = batch * length / sec
            out(name, {"status": "ok", "params": n_total, "params_in_matmuls": n_matmul,
                       "model": m, "batch": batch, "seq_len": length, "step_s": sec,
                       "tokens_per_sec": tps, "model_flops_per_token": flops,
                       "mfu_vs_spec": tps * flops / H200_BF16_PEAK if on_gpu else None,
                       "mfu_vs_measured_matmul": tps * flops / peak,
                       "compile_and_first_step_s": compile_s, "loss_first_last": [loss0, loss],
                       "finite": bool(math.isfinite(loss))})
            del state
        except Exception as e:  # noqa: BLE001 -- recorded, as above
            out(name, {"status": "error", "error": error_text(e),
                       "trace": traceback.format_exc()[-1500:]})

"""Device table of issue 11: the Pallas kernel vs cuDNN (materialised bias / no bias) vs
blockwise attention; forward and forward+backward time and peak memory.

    python benchmarks/attention_device.py              # H200: bf16, H=16, D=128, B*L=64k
    python benchmarks/attention_device.py --smoke      # CPU: tiny shapes, checks it runs

Entry point for scripts (the perf helper's scripts/device_check.sh): `run(smoke=...)`
returns a dict {"jax": version, "platform": ..., "config": {...}, "rows": [cell, ...]};
each cell is {"method", "encoding", "L", "B", "fwd_ms", "fwd_bwd_ms", "fwd_mem_bytes",
"fwd_bwd_mem_bytes", "error"}. Memory is what XLA's compiled executable reserves
(arguments + outputs + temporaries, `memory_analysis()`), a per-cell figure that needs no
allocator reset. Every cell catches its own failure (out of memory, no cuDNN on this
platform) and records the message in "error" with None figures, so one OOM at 64k never
hides the other cells. Times are medians of `--iters` runs after one warm-up run. No
speed is claimed from a CPU run.

Methods: kernel (attention="pallas"; RoPE rotated in-kernel, ALiBi/T5 bias in-kernel),
cudnn_bias (attention="cudnn" with the scheme's [B, H, L, L] bias materialised: ALiBi,
T5), cudnn (no bias: RoPE, cuDNN's own causal mask), blockwise (pure-JAX online softmax).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from posenc_jax.encodings.base import for_model
from posenc_jax.model.attention import attend, rotates_inside

__all__ = ["CELLS", "run"]

# (method, encoding, implementation)
CELLS = (("kernel", "rope", "pallas"), ("kernel", "alibi", "pallas"), ("kernel", "t5", "pallas"),
         ("cudnn", "rope", "cudnn"), ("cudnn_bias", "alibi", "cudnn"),
         ("cudnn_bias", "t5", "cudnn"), ("blockwise", "rope", "blockwise"),
         ("blockwise", "alibi", "blockwise"))


def _encoding(name: str, heads: int, head_dim: int):
    return for_model(name, embed_dim=heads * head_dim, num_heads=heads,
                     head_dim=head_dim)


def _functions(enc, impl, block):
    """(fwd, fwd+bwd) jitted functions of (q, k, v, params) for one cell."""
    raw = rotates_inside(enc, impl)

    def fwd(q, k, v, params):
        pos = jnp.arange(q.shape[1], dtype=jnp.int32)
        if not raw and "rotate" in enc.hooks:
            q, k = enc.rotate(params, q, k, pos, pos)
        return attend(q, k, v, encoding=enc, params=params, q_positions=pos, k_positions=pos,
                      causal=True, implementation=impl, block_q=block, block_k=block, rotated=not raw)

    def loss(q, k, v, params):
        return jnp.sum(fwd(q, k, v, params).astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def _time(compiled, args, iters: int) -> float:
    jax.block_until_ready(compiled(*args))                       # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _memory(compiled) -> int | None:
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def _cell(method, name, impl, *, length, batch, heads, kv_heads, head_dim, dtype,
          iters, block):
    row = {"method": method, "encoding": name, "L": length, "B": batch, "fwd_ms": None,
           "fwd_bwd_ms": None, "fwd_mem_bytes": None, "fwd_bwd_mem_bytes": None, "error": None}
    try:
        enc = _encoding(name, heads, head_dim)
        keys = jax.random.split(jax.random.key(0), 4)
        q = jax.random.normal(keys[0], (batch, length, heads, head_dim), dtype)
        k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim), dtype)
        v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim), dtype)
        args = (q, k, v, enc.init(keys[3]))
        for tag, fn in zip(("fwd", "fwd_bwd"), _functions(enc, impl, block)):
            compiled = fn.lower(*args).compile()
            row[f"{tag}_mem_bytes"] = _memory(compiled)
            row[f"{tag}_ms"] = _time(compiled, args, iters)
    except Exception as e:  # noqa: BLE001 -- OOM and missing cuDNN are results, not crashes
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return row


def run(*, smoke: bool = False, lengths=None, tokens: int | None = None, heads: int = 16,
        head_dim: int = 128, kv_heads: int | None = None, dtype: str = "bfloat16",
        iters: int = 5, cells=CELLS, log=print) -> dict:
    """The device table as a dict (see the module docstring). `smoke`: tiny CPU shapes."""
    if smoke:
        lengths, tokens, heads, head_dim, iters = lengths or (64,), tokens or 128, 2, 16, 1
    lengths = lengths or (4096, 16384, 65536)
    tokens = tokens or 65536
    kv_heads = kv_heads or heads
    config = {"tokens": tokens, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
              "dtype": dtype, "causal": True, "iters": iters, "lengths": list(lengths)}
    rows = []
    for length in lengths:
        for method, name, impl in cells:
            row = _cell(method, name, impl, length=length,
                        batch=max(1, tokens // length), heads=heads, kv_heads=kv_heads,
                        head_dim=head_dim, dtype=jnp.dtype(dtype), iters=iters,
                        block=64 if smoke else 512)
            log(json.dumps(row))
            rows.append(row)
    return {"jax": jax.__version__, "platform": jax.devices()[0].platform,
            "device": jax.devices()[0].device_kind, "config": config, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU check)")
    parser.add_argument("--lengths", type=int, nargs="*", default=None)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the dict as JSON here")
    args = parser.parse_args()
    result = run(smoke=args.smoke, lengths=args.lengths, iters=args.iters)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

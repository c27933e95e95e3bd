"""Peak memory and time of dense vs blockwise causal attention with ALiBi (CPU, float32).

    .venv/bin/python benchmarks/attention.py                 # L = 2048, 8192, 16384
    .venv/bin/python benchmarks/attention.py --lengths 2048 --grad
    .venv/bin/python benchmarks/attention.py --smoke         # L = 64, block 16, one call (CI)

B = 1, H = 8, D = 64. Each (implementation, length) runs in its own subprocess, so the peak
resident set (`ru_maxrss`) belongs to that configuration alone; the time is the mean of
`--repeats` jitted calls after one warm-up call (which compiles). The dense path materialises
the [1, H, L, L] bias, the scores and the probabilities in float32; when that projection
exceeds `--max-dense-gb` (default 16 GB on a 24 GB machine) the run is skipped and the
projection printed instead of taking the machine down. A child that fails (e.g. out of
memory) is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

H, D = 8, 64


def child(implementation: str, length: int, repeats: int, grad: bool, block: int) -> dict:
    import jax
    import jax.numpy as jnp

    import posenc_jax
    from posenc_jax.model.attention import attend

    enc = posenc_jax.get("alibi", num_heads=H)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (1, length, H, D), jnp.float32) for kk in keys)
    pos = jnp.arange(length)

    def fwd(q, k, v):
        return attend(q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos,
                      causal=True, implementation=implementation, block_q=block, block_k=block)

    fn = jax.jit(jax.grad(lambda *a: jnp.sum(fwd(*a)), argnums=(0, 1, 2)) if grad else fwd)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(q, k, v))
    compile_and_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(q, k, v))
    seconds = (time.perf_counter() - t0) / repeats
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "first_call_s": compile_and_first, "peak_gb": peak_kb / 2**20}


def dense_projection_gb(length: int, grad: bool) -> float:
    """Bias + scores + probabilities, float32 [1, H, L, L] each, plus the bool mask; about
    five such tensors live at once in the backward pass (measured 10.8 GB at L=8192)."""
    return ((5 if grad else 3) * 4 * H + 1) * length * length / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--implementations", nargs="+", default=["dense", "blockwise"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--grad", action="store_true", help="time forward + backward")
    parser.add_argument("--max-dense-gb", type=float, default=16.0)
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "L"), help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="L=64, block 16, 1 repeat (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.lengths, args.repeats, args.block = [64], 1, 16
    if args.child:
        result = child(args.child[0], int(args.child[1]), args.repeats, args.grad, args.block)
        print("RESULT " + json.dumps(result))
        return

    what = "forward + backward" if args.grad else "forward"
    print(f"causal ALiBi attention, {what}, B=1 H={H} D={D} float32, block={args.block}, "
          f"CPU ({os.cpu_count()} cores)")
    header = f"{'impl':>9} {'L':>6} {'time (s)':>9} {'peak RSS (GB)':>14}  note"
    print(header)
    print("-" * len(header))
    for length in args.lengths:
        for impl in args.implementations:
            projected = dense_projection_gb(length, args.grad)
            if impl == "dense" and projected > args.max_dense_gb:
                print(f"{impl:>9} {length:>6} {'-':>9} {'-':>14}  skipped: dense tensors "
                      f"project to {projected:.1f} GB > {args.max_dense_gb:g} GB")
                continue
            cmd = [sys.executable, __file__, "--child", impl, str(length), "--repeats",
                   str(args.repeats), "--block", str(args.block)] + (["--grad"] if args.grad
                                                                     else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                print(f"{impl:>9} {length:>6} {'-':>9} {'-':>14}  failed: {reason[:80]}")
                continue
            r = json.loads(lines[0][len("RESULT "):])
            note = f"first call {r['first_call_s']:.1f} s"
            if impl == "dense":
                note += f"; projected {projected:.2f} GB"
            print(f"{impl:>9} {length:>6} {r['seconds']:>9.3f} {r['peak_gb']:>14.2f}  {note}",
                  flush=True)


if __name__ == "__main__":
    main()

"""Long-context causal attention on CPU: ours against XLA's own dot and PyTorch's fused kernel.

    python benchmarks/attention_cpu.py --torch_python=/work/goldenvenv/bin/python
    python benchmarks/attention_cpu.py --lengths 8192,16384 --grad_lengths= --trials 3
    python benchmarks/attention_cpu.py --smoke        # ours only, L=256 forward, one trial (CI)

SmolLM2's attention: B=1, causal, 9 query heads sharing 3 kv heads, D=64, float32, no bias
(the rotation is outside attention). Per length, in ONE run, alternating trials:

- ours: `attend(..., implementation=X)` jitted, for each `--implementations` (default "auto"
  and "blockwise"), forward; forward + backward (`jax.grad` of the sum wrt q, k, v) at
  `--grad_lengths`;
- xla dot: the same process's jitted batched dot [9, n, 64] x [9, 64, L] (inner dim 64, as
  q.k^T), timed and scaled to the attention's FLOPs: what XLA:CPU's dot reaches at this shape;
- torch: `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
  enable_gqa=True)` (PyTorch's fused CPU flash kernel) in a worker process
  (`--torch_python`, the bench extra: torch is never imported by the package or the tests).

All rates use one nominal FLOP count, causal half counted: forward 2 * 2 * H * D * L^2 / 2,
forward + backward 3.5x that (the backward's five matmuls against the forward's two), so the
ratios are ratios of seconds. Reported: the median seconds and GFLOP/s of each and the median
over trials of the per-trial ratios ours / torch and ours / xla dot, with the load average
before and after (on a shared machine only same-run ratios mean anything).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from line_worker import TAG, LineWorker, add_worker_flags

H, KV, D = 9, 3, 64


def flops(length: int, grad: bool) -> float:
    """The nominal FLOPs of causal attention (half the square), x3.5 with the backward."""
    fwd = 2.0 * H * D * length * length
    return fwd * 3.5 if grad else fwd


def inputs(length: int, seed: int = 0):
    """q [1, L, 9, 64], k, v [1, L, 3, 64] float32 NumPy, the same in both frameworks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, length, H, D), dtype=np.float32),
            rng.standard_normal((1, length, KV, D), dtype=np.float32),
            rng.standard_normal((1, length, KV, D), dtype=np.float32))


# --- the torch worker (bench extra only) ----------------------------------------------------
def torch_missing(python: str) -> str | None:
    """None when `python` imports torch, else why not (one line)."""
    try:
        done = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                              timeout=300, check=False)
    except OSError as e:
        return f"{python} cannot import torch ({e})"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return f"{python} cannot import torch ({last}); install the bench extra"


def torch_worker(threads: int) -> None:
    """Answers `L grad` lines on stdin with the seconds of one scaled_dot_product_attention."""
    import torch  # only in the worker: torch is the bench extra's, never the package's

    torch.set_num_threads(threads)
    print(TAG + json.dumps({"torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        length, grad = int(line.split()[0]), line.split()[1] == "1"
        q, k, v = (torch.from_numpy(x).transpose(1, 2).contiguous().requires_grad_(grad)
                   for x in inputs(length))                               # [1, heads, L, D]
        t = time.perf_counter()
        with torch.set_grad_enabled(grad):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   enable_gqa=True)
            if grad:
                out.sum().backward()
        print(TAG + json.dumps({"seconds": time.perf_counter() - t}), flush=True)


class TorchWorker(LineWorker):
    """PyTorch's SDPA in `python` (this file with --torch_worker): `worker(length, grad)` ->
    seconds of one call."""

    def __init__(self, python: str, threads: int):
        super().__init__([python, str(pathlib.Path(__file__).resolve()), "--torch_worker",
                          "--torch_threads", str(threads)])

    def __call__(self, length: int, grad: bool) -> float:
        return self.ask(f"{length} {int(grad)}")["seconds"]


# --- ours -----------------------------------------------------------------------------------
class Ours:
    """Jitted `attend` (one implementation) and XLA's batched dot, in this process."""

    def __init__(self, block: int):
        # Imported here, not at the top: the torch worker runs this same file and must not
        # start JAX's thread pool beside torch's.
        import jax
        import jax.numpy as jnp

        import posenc_jax
        from posenc_jax.model.attention import attend

        self.jax, self.jnp, self.block = jax, jnp, block
        enc = posenc_jax.get("nope")
        self.fns = {}

        def make(impl: str, grad: bool):
            def fwd(q, k, v):
                pos = jnp.arange(q.shape[1])
                return attend(q, k, v, encoding=enc, params={}, q_positions=pos,
                              k_positions=pos, causal=True, implementation=impl,
                              block_q=block, block_k=block)
            return jax.jit(jax.grad(lambda *a: jnp.sum(fwd(*a)), argnums=(0, 1, 2))
                           if grad else fwd)
        self.make = make
        self.dot = jax.jit(lambda a, b: jnp.einsum("hqd,hdk->hqk", a, b))

    def attend(self, impl: str, length: int, grad: bool, arrays) -> float:
        fn = self.fns.setdefault((impl, grad), self.make(impl, grad))
        t = time.perf_counter()
        self.jax.block_until_ready(fn(*arrays))
        return time.perf_counter() - t

    def dot_gflops(self, length: int) -> float:
        """GFLOP/s of a [9, n, 64] x [9, 64, L] float32 dot (n = min(L, 512)), best of 3."""
        n = min(length, 512)
        a = self.jnp.ones((H, n, D), self.jnp.float32)
        b = self.jnp.ones((H, D, length), self.jnp.float32)
        self.dot(a, b).block_until_ready()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            self.dot(a, b).block_until_ready()
            best = min(best, time.perf_counter() - t)
        return 2.0 * H * n * D * length / best / 1e9


def measure(length: int, grad: bool, ours: Ours, impls: list[str], torch: TorchWorker | None,
            trials: int) -> dict:
    load_before = os.getloadavg()
    arrays = [ours.jnp.asarray(x) for x in inputs(length)]
    names = [f"ours {i}" for i in impls] + (["torch"] if torch else [])
    times: dict[str, list[float]] = {n: [] for n in names}
    dots: list[float] = []
    run = {f"ours {i}": (lambda i=i: ours.attend(i, length, grad, arrays)) for i in impls}
    if torch:
        run["torch"] = lambda: torch(length, grad)
    for f in run.values():                                   # compile / warm up
        f()
    for trial in range(trials):
        for name in (names if trial % 2 == 0 else names[::-1]):
            times[name].append(run[name]())
        dots.append(ours.dot_gflops(length))
        print(f"  L={length} {'fwd+bwd' if grad else 'fwd'} trial {trial}: " + ", ".join(
            f"{k} {v[-1]:.3f} s" for k, v in times.items()) + f", xla dot {dots[-1]:.1f} "
            "GFLOP/s", flush=True)
    f = flops(length, grad)
    out = {"seq_len": length, "grad": grad, "trials": trials, "load_before": load_before,
           "xla_dot_gflops": statistics.median(dots)}
    for name, ts in times.items():
        out[name] = {"median_s": statistics.median(ts), "gflops": f / statistics.median(ts) / 1e9}
    for i in impls:
        ts = times[f"ours {i}"]
        out[f"ours {i}"]["x_dot"] = statistics.median(f / t / 1e9 / d for t, d in zip(ts, dots))
        if torch:
            out[f"ours {i}"]["x_torch"] = statistics.median(
                b / a for a, b in zip(ts, times["torch"]))
    out["load_after"] = os.getloadavg()
    return out


def report(results: list[dict], impls: list[str]) -> None:
    cols = "".join(f" {'ours ' + i:>16} {'x dot':>6} {'x torch':>7}" for i in impls)
    print(f"\n{'L':>6} {'pass':>7}{cols} {'xla dot':>8} {'torch':>7}  load before/after")
    for r in results:
        row = ""
        for i in impls:
            o = r[f"ours {i}"]
            x = f"{o['x_torch']:>7.2f}" if "x_torch" in o else f"{'-':>7}"
            row += f" {o['gflops']:>16.1f} {o['x_dot']:>6.2f} {x}"
        t = f"{r['torch']['gflops']:>7.1f}" if isinstance(r.get("torch"), dict) else f"{'-':>7}"
        print(f"{r['seq_len']:>6} {'fwd+bwd' if r['grad'] else 'fwd':>7}{row} "
              f"{r['xla_dot_gflops']:>8.1f} {t}  {r['load_before'][0]:.2f} / "
              f"{r['load_after'][0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="L=256 forward, one trial, ours only (CI)")
    parser.add_argument("--lengths", default="2048,4096,8192,16384",
                        help="forward lengths (32768 not run yet: expect about 4x 16384's time)")
    parser.add_argument("--grad_lengths", default="2048,4096", help="forward + backward")
    parser.add_argument("--implementations", default="auto,blockwise")
    parser.add_argument("--block", type=int, default=256, help="block_q = block_k of attend")
    parser.add_argument("--trials", type=int, default=3)
    add_worker_flags(parser)
    args = parser.parse_args()
    if args.torch_worker:
        return torch_worker(args.torch_threads)
    impls = args.implementations.split(",")
    if args.smoke:
        args.lengths, args.grad_lengths, args.trials, args.block = "256", "", 1, 64
        missing = "--smoke times ours alone"
    else:
        missing = torch_missing(args.torch_python)
        if missing:
            raise SystemExit(f"attention_cpu: {missing} (or pass --torch_python=...); --smoke "
                             "runs ours alone")
    torch = None if missing else TorchWorker(args.torch_python, args.torch_threads)
    print(f"causal attention, B=1, H={H} (kv {KV}), D={D}, float32, block {args.block}; "
          f"torch {torch.info['torch'] if torch else 'NOT run: ' + missing}; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    ours = Ours(args.block)
    plan = [(int(x), False) for x in args.lengths.split(",") if x]
    plan += [(int(x), True) for x in args.grad_lengths.split(",") if x]
    results = []
    for length, grad in plan:
        results.append(measure(length, grad, ours, impls, torch, args.trials))
        if torch is None:
            results[-1]["torch"] = f"not run: {missing}"
        report(results[-1:], impls)
    if torch is not None:
        torch.close()
    print("\nsummary (GFLOP/s, causal half counted; x dot = ours / XLA's dot at inner dim 64, "
          "x torch = ours / torch SDPA)")
    report(results, impls)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

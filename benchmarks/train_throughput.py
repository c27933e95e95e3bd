"""Training throughput of a config, its model FLOPs per token, and the fraction of this
machine's measured matmul rate that the train step achieves.

    python benchmarks/train_throughput.py                        # configs/default.py
    python benchmarks/train_throughput.py --config=configs/tiny.py --steps=50
    python benchmarks/train_throughput.py --set model.dtype=bfloat16 --set batch_size=16
    python benchmarks/train_throughput.py --smoke     # tiny.py shrunk, 1 step, 128^3 matmul (CI)

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): 6 N + 12 n_layers H D L,
where N counts the parameters that enter a matmul (every projection, and the tied embedding
once, as the output projection; the input lookup is a gather and the norms are elementwise),
and the second term is the attention scores and the weighted sum of values, forward and
backward, over the full L x L window (the dense kernel computes the masked half as well).
The matmul rate is a `jnp.dot` of two n x n matrices (2 n^3 FLOPs, best of 5) in float32
(and in the model's compute dtype, if another), timed in the same process before and after
the train steps, keeping the better; each train step is timed on its own and
the median is reported (robust on a machine shared with other jobs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import numpy as np

from train import data, sharding, xla_flags
from train import state as state_lib
from train import step as step_lib
from train.engine import flops


def load_config(path: str, overrides: list[str]):
    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for item in overrides:
        key, value = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = config
        for p in parents:
            node = node[p]
        old = node[leaf]
        node[leaf] = type(old)(value) if old is not None and not isinstance(old, str) else value
    return config


def matmul_flops_per_sec(n: int, *, dtype=jnp.float32, repeats: int = 5) -> float:
    """Best-of-`repeats` n x n @ n x n rate on the default device."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def model_flops_per_token(setup, seq_len: int) -> tuple[float, int, int]:
    """(6 N + 12 n_layers H D L, N in matmuls, all params)."""
    cfg = setup.model_config
    params = setup.abstract["params"]
    leaves = jax.tree_util.tree_leaves_with_path(params)
    total = sum(math.prod(x.shape) for _, x in leaves)
    matmul = sum(math.prod(x.shape) for _, x in leaves if len(x.shape) >= 2)
    # Encoding tables (learned PE rows, T5/Shaw buckets) are lookups, not matmuls.
    table = sum(math.prod(x.shape) for path, x in leaves
                if any(getattr(k, "key", None) in ("pe", "input_pe") for k in path))
    matmul -= table
    # forward and backward (3x) of dense attention's 4 H D per (query, key) pair
    attention = 3 * flops.attention_flops(cfg, seq_len, causal=False) / seq_len
    return 6 * matmul + attention, matmul, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.py"))
    parser.add_argument("--steps", type=int, default=20, help="timed train steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument("--matmul_n", type=int, default=2048)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, e.g. model.dtype=bfloat16 (repeatable)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny.py shrunk (1 layer, B=2, L=16), one step, 128^3 matmul (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.config, args.steps, args.warmup, args.matmul_n = (
            str(ROOT / "configs" / "tiny.py"), 1, 0, 128)
    xla_flags.apply_cpu_defaults()  # before the first computation starts JAX's backend

    config = load_config(args.config, args.set)
    if args.smoke:  # smaller still than tiny.py: one layer, B=2, L=16
        config.batch_size, config.seq_len = 2, 16
        config.model.num_layers = 1
    compute = jnp.dtype(config.model.dtype)
    peak = matmul_flops_per_sec(args.matmul_n)
    peak_compute = matmul_flops_per_sec(args.matmul_n, dtype=compute)

    mesh = sharding.make_mesh(config.mesh)
    setup = state_lib.make_setup(config, mesh)
    flops_token, n_matmul, n_total = model_flops_per_token(setup, config.seq_len)
    stream = data.config_stream(config.dataset, config.dataset.train_split)
    batch, length = config.batch_size, config.seq_len
    train_step = step_lib.make_train_step(setup, packed=config.dataset.packed,
                                          accum_steps=config.get("grad_accum_steps", 1))
    batches = [sharding.global_batch(mesh, data.train_batch(
        stream, step=i, batch_size=batch, seq_len=length, seed=config.seed,
        packed=config.dataset.packed), global_batch_size=batch)
        for i in range(args.warmup + args.steps + 1)]

    t = time.perf_counter()
    state = state_lib.init_state(setup, seed=config.seed)
    state, metrics = train_step(state, batches[0])
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t
    for i in range(args.warmup):
        state, metrics = train_step(state, batches[1 + i])
    jax.block_until_ready(metrics)
    times = []  # each step timed alone: the median is robust to a shared machine's noise
    for i in range(args.steps):
        t = time.perf_counter()
        state, metrics = train_step(state, batches[1 + args.warmup + i])
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    seconds = float(np.median(times)) * args.steps

    # Measured again after the steps: on a shared machine keep the better (truer) peak.
    peak = max(peak, matmul_flops_per_sec(args.matmul_n))
    peak_compute = max(peak_compute, matmul_flops_per_sec(args.matmul_n, dtype=compute))
    tokens_per_sec = args.steps * batch * length / seconds
    achieved = tokens_per_sec * flops_token
    m = config.model
    result = {
        "config": os.path.relpath(args.config, ROOT), "overrides": args.set,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
                   f"{jax.device_count()} {jax.devices()[0].platform} device(s), "
                   f"jax {jax.__version__}",
        "model": f"{m.num_layers} layers, E={m.embed_dim}, H={m.num_heads}, F={m.mlp_dim}, "
                 f"{m.encoding}, {m.dtype}; B={batch}, L={length}",
        "params": n_total, "params_in_matmuls": n_matmul,
        "model_flops_per_token": flops_token,
        "step_seconds_median": seconds / args.steps,
        "step_seconds_min_max": f"{min(times):.3f} / {max(times):.3f}",
        "tokens_per_sec": tokens_per_sec,
        "achieved_gflops": achieved / 1e9,
        "matmul_n": args.matmul_n, "matmul_gflops_float32": peak / 1e9,
        "fraction_of_float32_matmul_rate": achieved / peak,
        f"matmul_gflops_{compute.name}": peak_compute / 1e9,
        f"fraction_of_{compute.name}_matmul_rate": achieved / peak_compute,
        "compile_and_first_step_s": compile_s,
        "final_loss": float(metrics["loss"]),
    }
    width = max(map(len, result))
    for key, value in result.items():
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")
    print(json.dumps(result))
    assert np.isfinite(result["final_loss"])


if __name__ == "__main__":
    main()

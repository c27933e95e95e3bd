"""Compile time of a train step against depth: the Python loop over layers vs `scan_layers`.

    python benchmarks/scan_compile.py                    # 4 and 32 layers, both, 3 repeats
    python benchmarks/scan_compile.py --layers 4,8,16,32,64 --repeats 1
    python benchmarks/scan_compile.py --pattern gemma3 --layers 18 --small
    python benchmarks/scan_compile.py --smoke        # 2 layers, E=32, B=2, L=16 (CI), and
                                                     # 6 Gemma 3 layers

`--pattern gemma3`: Gemma 3's layer pattern, five sliding-window layers (window 64, RoPE base
1e4) then one global layer (RoPE base 1e6), repeated; the scan runs one six-layer group per
step (`posenc_jax.model.scan`), plus an unrolled remainder when 6 does not divide the depth.
`--small`: E=64, 4 heads, MLP 128, B=2, L=128 (compile time, not the matmuls, is measured).

The step is the loss's value and gradient plus an AdamW update (optax), jitted; timed is
trace + lower + compile (`jax.jit(step).lower(...).compile()`), wall clock and this process's
CPU time (robust on a shared machine), best of `--repeats` (each repeat a fresh function, so
nothing comes from a cache); `lower_s` is the trace + lower part of the best wall time. Model: E=256, 8 heads, SwiGLU 688, RoPE; B=16, L=256; float32.
A one-step check runs each compiled step so that loop and scan are known to agree.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from posenc_jax.model.transformer import Transformer, TransformerConfig
from train import xla_flags

FULL = {"embed_dim": 256, "num_heads": 8, "mlp_dim": 688, "batch": 16, "seq_len": 256}
SMOKE = {"embed_dim": 32, "num_heads": 2, "mlp_dim": 64, "batch": 2, "seq_len": 16}
SMALL = {"embed_dim": 64, "num_heads": 4, "mlp_dim": 128, "batch": 2, "seq_len": 128}


def pattern_kwargs(pattern: str, layers: int) -> dict:
    """The per-layer settings of a pattern: {} (every layer alike) or Gemma 3's."""
    if pattern == "uniform":
        return {}
    group = [64] * 5 + [None]
    windows = (group * (layers // 6 + 1))[:layers]
    return {"sliding_window": windows,
            "layer_encodings": [("rope", {"base": 1e4 if w else 1e6}) for w in windows]}


def compile_seconds(layers: int, scan: bool, repeats: int, shape: dict = FULL,
                    pattern: str = "uniform") -> tuple[float, float, float, float]:
    """(best wall s, its lower s, best CPU s, loss after one step) for one depth and mode."""
    cfg = TransformerConfig(vocab_size=256, num_layers=layers, embed_dim=shape["embed_dim"],
                            num_heads=shape["num_heads"], mlp_dim=shape["mlp_dim"],
                            scan_layers=scan, **pattern_kwargs(pattern, layers))
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-3)
    opt = tx.init(params)
    tokens = jnp.zeros((shape["batch"], shape["seq_len"] + 1), jnp.int32)
    best_wall = best_cpu = best_lower = float("inf")
    for _ in range(repeats):
        def step(params, opt, tokens):
            def loss(p):
                logits = nnx.merge(graphdef, p)(tokens[:, :-1])
                return optax.softmax_cross_entropy_with_integer_labels(
                    logits, tokens[:, 1:]).mean()
            value, grads = jax.value_and_grad(loss)(params)
            updates, opt = tx.update(grads, opt, params)
            return optax.apply_updates(params, updates), opt, value

        t, c = time.perf_counter(), time.process_time()
        lowered = jax.jit(step).lower(params, opt, tokens)
        lower = time.perf_counter() - t
        compiled = lowered.compile()
        wall = time.perf_counter() - t
        if wall < best_wall:
            best_wall, best_lower = wall, lower
        best_cpu = min(best_cpu, time.process_time() - c)
    _, _, value = compiled(params, opt, tokens)
    return best_wall, best_lower, best_cpu, float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="4,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pattern", choices=("uniform", "gemma3"), default="uniform")
    parser.add_argument("--small", action="store_true", help="E=64, B=2, L=128")
    parser.add_argument("--smoke", action="store_true",
                        help="2 tiny layers and 6 tiny Gemma 3 layers, loop and scan, once (CI)")
    args = parser.parse_args()
    shape = SMOKE if args.smoke else SMALL if args.small else FULL
    runs = [(args.pattern, int(n)) for n in args.layers.split(",")]
    if args.smoke:
        runs, args.repeats = [("uniform", 2), ("gemma3", 6)], 1
    xla_flags.apply_cpu_defaults()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    print(f"{'pattern':<8} {'layers':>6} {'mode':<5} {'wall_s':>7} {'lower_s':>7} {'cpu_s':>7}  "
          "loss")
    for pattern, layers in runs:
        losses = []
        for scan in (False, True):
            wall, lower, cpu, loss = compile_seconds(layers, scan, args.repeats, shape, pattern)
            losses.append(loss)
            print(f"{pattern:<8} {layers:>6} {'scan' if scan else 'loop':<5} {wall:>7.2f} "
                  f"{lower:>7.2f} {cpu:>7.2f}  {loss:.6f}", flush=True)
        assert abs(losses[0] - losses[1]) < 1e-4, losses


if __name__ == "__main__":
    main()

"""Compile time of a train step against depth: the Python loop over layers vs `scan_layers`.

    python benchmarks/scan_compile.py                    # 4 and 32 layers, both, 3 repeats
    python benchmarks/scan_compile.py --layers 4,8,16,32,64 --repeats 1
    python benchmarks/scan_compile.py --smoke        # 2 layers, E=32, B=2, L=16 (CI)

The step is the loss's value and gradient plus an AdamW update (optax), jitted; timed is
trace + lower + compile (`jax.jit(step).lower(...).compile()`), wall clock and this process's
CPU time (robust on a shared machine), best of `--repeats` (each repeat a fresh function, so
nothing comes from a cache). Model: E=256, 8 heads, SwiGLU 688, RoPE; B=16, L=256; float32.
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


def compile_seconds(layers: int, scan: bool, repeats: int, shape: dict = FULL
                    ) -> tuple[float, float, float]:
    """(best wall s, best CPU s, loss after one step) for one depth and mode."""
    cfg = TransformerConfig(vocab_size=256, num_layers=layers, embed_dim=shape["embed_dim"],
                            num_heads=shape["num_heads"], mlp_dim=shape["mlp_dim"],
                            scan_layers=scan)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-3)
    opt = tx.init(params)
    tokens = jnp.zeros((shape["batch"], shape["seq_len"] + 1), jnp.int32)
    best_wall = best_cpu = float("inf")
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
        compiled = jax.jit(step).lower(params, opt, tokens).compile()
        best_wall = min(best_wall, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    _, _, value = compiled(params, opt, tokens)
    return best_wall, best_cpu, float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="4,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="2 tiny layers, loop and scan, once (CI)")
    args = parser.parse_args()
    shape = SMOKE if args.smoke else FULL
    if args.smoke:
        args.layers, args.repeats = "2", 1
    xla_flags.apply_cpu_defaults()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    print(f"{'layers':>6} {'mode':<5} {'wall_s':>7} {'cpu_s':>7}  loss")
    for layers in map(int, args.layers.split(",")):
        losses = []
        for scan in (False, True):
            wall, cpu, loss = compile_seconds(layers, scan, args.repeats, shape)
            losses.append(loss)
            print(f"{layers:>6} {'scan' if scan else 'loop':<5} {wall:>7.2f} {cpu:>7.2f}  "
                  f"{loss:.6f}", flush=True)
        assert abs(losses[0] - losses[1]) < 1e-4, losses


if __name__ == "__main__":
    main()

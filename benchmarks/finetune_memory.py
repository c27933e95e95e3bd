"""Memory of a fine-tune's train step by sequence length, remat policy and loss; tokens/s.

    python benchmarks/finetune_memory.py [--checkpoint=PATH] [--lengths=4096,8192,16384,32768]
    python benchmarks/finetune_memory.py --smoke       # tiny llama, 64 tokens, none / block
                                                       # (none+chunked and block+full only)

Part 1 compiles (never runs) the train step of `configs/extend_finetune.py` on the checkpoint
(SmolLM2-135M from $POSENC_PRETRAINED_DIR by default) for one sequence of each length, for each
remat policy of the model (`TransformerConfig.remat`: `posenc_jax.model.remat`) and for the
chunked loss (`loss_chunk` 1024) against the full [B, L, V] logits (0), with
`jax.ShapeDtypeStruct` arguments, and prints XLA's `memory_analysis()`: temporaries (what the
step allocates beyond its arguments and outputs), arguments (state + batch) and outputs. Only
the checkpoint's config is read, no weights. Layers run as one scan (`scan_layers`: the compile
time of one block; the same memory as the loop), attention blockwise (block 512): XLA's dense
attention would hold [H, L, L] scores. The figures are XLA:CPU's; a GPU build fuses
differently, so read them as an estimate of the GPU's.

Part 2 runs train steps at 2048 tokens (`--throughput_len`) from the checkpoint's weights and
prints tokens/s for the full fine-tune and LoRA (rank 8 on q, k, v, o), each with and without
remat where available: the median of `--steps` steps after one compiling step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

from train import sharding, state, trainer
from train import step as step_lib
from train.extend import finetune

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny" / "llama"


def base_config(checkpoint: str, *, length: int, remat: str, chunk: int, lora: bool):
    config = finetune.base_config()
    config.init.checkpoint = checkpoint
    config.seq_len, config.batch_size, config.loss_chunk = length, 1, chunk
    config.model.attention, config.model.block_size = "blockwise", min(512, length)
    config.model.scan_layers = True
    config.model.remat = remat
    config.lora.enabled = lora
    config.mesh.update({"data": 1, "fsdp": 1, "context": 1, "tensor": 1})
    return config


def batch_shapes(length: int) -> dict:
    out = {k: jax.ShapeDtypeStruct((1, length), jnp.int32)
           for k in ("inputs", "targets", "positions", "segment_ids")}
    out["weights"] = jax.ShapeDtypeStruct((1, length), jnp.float32)
    return out


def memory(checkpoint: str, *, length: int, remat: str, chunk: int) -> dict:
    """XLA's memory analysis of one compiled train step (bytes)."""
    config = base_config(checkpoint, length=length, remat=remat, chunk=chunk, lora=False)
    setup = state.make_setup(config, sharding.make_mesh(config.mesh,
                                                        devices=jax.devices()[:1]))
    step = step_lib.make_train_step(setup, chunk=chunk)
    t = time.perf_counter()
    analysis = step.lower(setup.abstract, batch_shapes(length)).compile().memory_analysis()
    return {"temp": analysis.temp_size_in_bytes, "args": analysis.argument_size_in_bytes,
            "out": analysis.output_size_in_bytes, "compile_s": time.perf_counter() - t}


def throughput(checkpoint: str, *, length: int, remat: str, lora: bool, steps: int,
               workdir: str) -> float:
    """Median tokens/s of `steps` train steps after the compiling one."""
    config = base_config(checkpoint, length=length, remat=remat, chunk=1024, lora=lora)
    config.model.scan_layers = False
    config.dataset.max_tokens = 8 * length
    config.num_train_steps, config.log_every_steps = steps + 1, 1
    config.checkpoint_every_steps, config.eval.lengths = 10**6, ()
    config.async_checkpointing = False
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1], progress=False)
    lines = pathlib.Path(workdir, "metrics.jsonl").read_text().splitlines()
    rates = [json.loads(x)["tokens_per_sec"] for x in lines if "tokens_per_sec" in x]
    return statistics.median(rates)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--lengths", default="4096,8192,16384,32768")
    parser.add_argument("--remat", default="none,block,dots,attention")
    parser.add_argument("--throughput_len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--throughput", type=int, default=1, help="0: the memory table only")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or str(pathlib.Path(
        os.environ.get("POSENC_PRETRAINED_DIR") or ROOT / ".pretrained") / SMOLLM2)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.smoke:
        checkpoint, lengths, args.throughput_len, args.steps = str(TINY), [64], 64, 1
    policies = args.remat.split(",")
    print(f"checkpoint {checkpoint}; jax {jax.__version__} on {jax.devices()[0].platform}")
    print("| tokens | remat | loss | temp GB | args GB | out GB | compile s |")
    print("|---|---|---|---|---|---|---|")
    rows = [(n, remat, chunk) for n in lengths for remat in policies for chunk in (1024, 0)]
    if args.smoke:  # each policy and each loss once (a pairwise cover: 2 compiles, not 4)
        rows = [(lengths[0], "none", 1024), (lengths[0], "block", 0)]
    for length, remat, chunk in rows:
        m = memory(checkpoint, length=length, remat=remat, chunk=chunk)
        print(f"| {length} | {remat} | {'chunked' if chunk else 'full'} | "
              f"{m['temp'] / 1e9:.3f} | {m['args'] / 1e9:.3f} | {m['out'] / 1e9:.3f} | "
              f"{m['compile_s']:.1f} |", flush=True)
    if not args.throughput:
        return
    print(f"\ntokens/s at {args.throughput_len} tokens (batch 1, chunked loss):")
    for lora in (False, True):
        for remat in ("none",) if args.smoke else ("none", "block"):
            with tempfile.TemporaryDirectory() as workdir:
                rate = throughput(checkpoint, length=args.throughput_len, remat=remat,
                                  lora=lora, steps=args.steps, workdir=workdir)
            print(f"  {'LoRA' if lora else 'full'} remat={remat}: {rate:.0f} tokens/s",
                  flush=True)


if __name__ == "__main__":
    main()

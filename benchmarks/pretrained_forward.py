"""Forward speed of a loaded pretrained model against transformers: SmolLM2-135M, one run, alternating.

    /work/benchvenv/bin/python benchmarks/pretrained_forward.py              # L = 512, 2048, 8192
    python benchmarks/pretrained_forward.py --lengths 512,2048 --trials 3 \
        --torch_python=/work/goldenvenv/bin/python        # torch in another environment
    python benchmarks/pretrained_forward.py --lengths 2048,8192,16384 --trials 2 \
        --torch_python=/work/goldenvenv/bin/python        # long context (16k: not yet run)
    python benchmarks/pretrained_forward.py --lengths 8192 --trials 1 --breakdown \
        --torch_python=/work/goldenvenv/bin/python        # where each forward's time goes
    python benchmarks/pretrained_forward.py --smoke     # tiny random checkpoint, ours only (CI)

Ours is `posenc_jax.pretrained.load` of `--gguf` (default
`$POSENC_PRETRAINED_DIR/SmolLM2-135M-Instruct.Q4_1.gguf`, the directory defaulting to
`<repo>/.pretrained`; `bash scripts/fetch_pretrained.sh DIR` puts it there), float32, its
forward `lm.model(tokens)` jitted. The reference is transformers loading the same file the way
scripts/make_pretrained_golden.py does (`AutoModelForCausalLM.from_pretrained(dir,
gguf_file=..., dtype=torch.float32)`), PyTorch eager (no `torch.compile`), float32, under
`torch.inference_mode()`, `use_cache=False`, attention `--torch_attention` (transformers'
default "sdpa"; "eager" for its plain matmul attention). Both compute the full logits
[1, L, V] of the same random token ids (batch 1).

PyTorch, transformers, gguf and accelerate come from the optional `bench` extra, never from
the package or CI, and only ever in a worker process (`--torch_python`, default this
interpreter) that this script starts and talks to over a pipe, so each framework keeps its own
thread pool. Per length: both are warmed up (ours compiles), then `--trials` trials, each one
forward of ours and one of torch, the order reversed every trial. Reported: the median
seconds and tokens/s of each, and the median over trials of the per-trial ratio ours / torch
(robust to load that drifts between trials), with the load average before and after: on a
shared machine only a quiet run's ratio means much.

`--breakdown` then times each piece of both forwards (attention core, projections + rope,
MLP, norms, head, the rest: `benchmarks/forward_pieces.py`) and prints them side by side.

`--smoke` (CI, seconds, no torch) runs ours alone on the tiny random Llama checkpoint of
tests/data/pretrained/tiny/llama at L=16, one trial, with the breakdown, and says the torch
side was not run. A
full run where `--torch_python` cannot import torch refuses to start.
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

import forward_pieces
from line_worker import TAG, LineWorker, add_worker_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOKE_CHECKPOINT = ROOT / "tests" / "data" / "pretrained" / "tiny" / "llama"


def default_gguf() -> pathlib.Path:
    return pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR", ROOT / ".pretrained")) / GGUF_NAME


def token_ids(length: int, vocab: int, seed: int = 0):
    """[1, length] int32 token ids, the same in both frameworks."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, vocab, size=(1, length), dtype=np.int32)


# --- the torch worker (bench extra only) ----------------------------------------------------
def torch_missing(python: str) -> str | None:
    """None when `python` imports torch, transformers, gguf and accelerate, else why not."""
    code = "import torch, transformers, gguf, accelerate"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              timeout=300, check=False)
    except OSError as e:
        return f"{python} cannot import torch ({e})"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"{python} cannot import torch ({last}); install the bench extra"


def torch_worker(gguf: str, attention: str, threads: int) -> None:
    """Loads transformers' model, then answers `L` lines on stdin with one timed forward."""
    import torch  # only in the worker: torch is the bench extra's, never the package's
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    path = pathlib.Path(gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32,
        attn_implementation=attention).eval()
    vocab = model.config.vocab_size
    print(TAG + json.dumps({"ready": True, "vocab": vocab, "torch": torch.__version__,
                            "transformers": transformers.__version__}), flush=True)
    for line in sys.stdin:
        ids = torch.from_numpy(token_ids(int(line.split()[0]), vocab)).long()
        if line.split()[1:] == ["breakdown"]:
            print(TAG + json.dumps(forward_pieces.torch_pieces(model, ids)), flush=True)
            continue
        t = time.perf_counter()
        with torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits
        seconds = time.perf_counter() - t
        print(TAG + json.dumps({"seconds": seconds, "shape": list(logits.shape)}), flush=True)
        del logits


class TorchWorker(LineWorker):
    """transformers' model of the same GGUF in `python` (this file with --torch_worker):
    `forward(length)` -> seconds of one forward."""

    def __init__(self, python: str, gguf: pathlib.Path, attention: str, threads: int):
        super().__init__([python, str(pathlib.Path(__file__).resolve()), "--torch_worker",
                          "--gguf", str(gguf), "--torch_attention", attention,
                          "--torch_threads", str(threads)],
                         env={**os.environ, "TQDM_DISABLE": "1"})  # GGUF's bar

    def forward(self, length: int) -> float:
        return self.ask(str(length))["seconds"]

    def pieces(self, length: int) -> dict[str, float]:
        return self.ask(f"{length} breakdown")


# --- ours -----------------------------------------------------------------------------------
class Ours:
    def __init__(self, path: pathlib.Path, attention: str):
        # Imported here, not at the top: the torch worker runs this same file and must not
        # start JAX's thread pool beside torch's (no cycle is involved).
        import jax
        from flax import nnx

        from posenc_jax import pretrained

        self.jax = jax
        t = time.perf_counter()
        self.lm = pretrained.load(path, dtype="float32", attention=attention)
        self.load_s = time.perf_counter() - t
        graphdef, self.state = nnx.split(self.lm.model)
        self.fn = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
        self.vocab = self.lm.config.vocab_size

    def forward(self, length: int) -> float:
        tokens = self.jax.numpy.asarray(token_ids(length, self.vocab))
        t = time.perf_counter()
        self.fn(self.state, tokens).block_until_ready()
        return time.perf_counter() - t


def measure(length: int, ours: Ours, torch: TorchWorker | None, trials: int,
            breakdown: bool = False) -> dict:
    load_before = os.getloadavg()
    t = time.perf_counter()
    ours.forward(length)                                   # compiles
    warm = {"ours_compile_and_first_s": time.perf_counter() - t}
    if torch is not None:
        warm["torch_first_s"] = torch.forward(length)
    times = {"ours": [], "torch": []}
    for trial in range(trials):
        order = ["ours", "torch"] if trial % 2 == 0 else ["torch", "ours"]
        for name in order:
            if name == "ours":
                times["ours"].append(ours.forward(length))
            elif torch is not None:
                times["torch"].append(torch.forward(length))
        print(f"  L={length} trial {trial}: " + ", ".join(
            f"{k} {v[-1]:.3f} s" for k, v in times.items() if v), flush=True)
    out = {"seq_len": length, "trials": trials, "load_before": load_before, **warm}
    for name, ts in times.items():
        if ts:
            out[name] = {"median_s": statistics.median(ts), "seconds": ts,
                         "tokens_per_sec": length / statistics.median(ts)}
    if times["torch"]:
        out["ratio_ours_over_torch"] = statistics.median(
            b / a for a, b in zip(times["ours"], times["torch"]))   # torch s / ours s
    if breakdown:  # after the trials, so the compiled pieces never slow them
        whole = out["ours"]["median_s"]
        out["breakdown"] = {"ours": forward_pieces.ours_pieces(ours.lm.model, length, whole),
                            "torch": torch.pieces(length) if torch is not None else None}
        forward_pieces.report(length, **out["breakdown"])
    out["load_after"] = os.getloadavg()
    return out


def report(results: list[dict]) -> None:
    print(f"\n{'L':>5} {'ours tok/s':>11} {'torch tok/s':>12} {'x torch':>8}  load before/after")
    for r in results:
        o = r["ours"]["tokens_per_sec"]
        t = f"{r['torch']['tokens_per_sec']:>12.0f}" if isinstance(r.get("torch"), dict) \
            else f"{'-':>12}"
        x = f"{r['ratio_ours_over_torch']:>8.2f}" if "ratio_ours_over_torch" in r else f"{'-':>8}"
        print(f"{r['seq_len']:>5} {o:>11.0f} {t} {x}  {r['load_before'][0]:.2f} / "
              f"{r['load_after'][0]:.2f}")
        if isinstance(r.get("torch"), str):
            print(f"      torch side {r['torch']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny random checkpoint, L=16, one trial, ours only (CI)")
    parser.add_argument("--gguf", default=None, help=f"default $POSENC_PRETRAINED_DIR/{GGUF_NAME}")
    parser.add_argument("--lengths", default="512,2048,8192")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--attention", default="auto", help="our attention backend")
    parser.add_argument("--torch_attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each piece (attention, projections, MLP, head...) of "
                             "both forwards after the trials (benchmarks/forward_pieces.py)")
    add_worker_flags(parser)
    args = parser.parse_args()
    if args.torch_worker:
        return torch_worker(args.gguf, args.torch_attention, args.torch_threads)
    if args.smoke:
        path, args.lengths, args.trials, args.breakdown = SMOKE_CHECKPOINT, "16", 1, True
        missing = "--smoke times ours alone"
    else:
        path = pathlib.Path(args.gguf) if args.gguf else default_gguf()
        if not path.is_file():
            raise SystemExit(f"pretrained_forward: {path}: no such file (bash "
                             "scripts/fetch_pretrained.sh DIR, then POSENC_PRETRAINED_DIR=DIR "
                             "or --gguf=PATH)")
        missing = torch_missing(args.torch_python)
        if missing:
            raise SystemExit(f"pretrained_forward: {missing} (or pass --torch_python=...); "
                             "--smoke runs ours alone")
    print(f"checkpoint {path}; load average {os.getloadavg()[0]:.2f}", flush=True)
    t = time.perf_counter()
    torch = None if missing else TorchWorker(args.torch_python, path, args.torch_attention,
                                             args.torch_threads)
    if torch is not None:
        print(f"torch {torch.info['torch']}, transformers {torch.info['transformers']}, "
              f"attention {args.torch_attention}, {args.torch_threads} threads; loaded in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    ours = Ours(path, args.attention)
    print(f"ours: pretrained.load in {ours.load_s:.1f} s, attention "
          f"{args.attention!r}, {ours.lm.config.num_layers} layers", flush=True)
    if torch is None:
        print(f"torch side NOT run: {missing}", flush=True)
    results = []
    for length in map(int, args.lengths.split(",")):
        results.append(measure(length, ours, torch, args.trials, args.breakdown))
        if torch is None:
            results[-1]["torch"] = f"not run: {missing}"   # in the JSON too
        report(results[-1:])
    if torch is not None:
        torch.close()
    print("\nsummary (tokens/s of one forward, batch 1, float32; x torch = ours / torch)")
    report(results)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

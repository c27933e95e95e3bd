"""Training speed against PyTorch eager: the same model, both frameworks, one run, alternating.

    /tmp/benchenv/bin/python benchmarks/vs_pytorch.py --quick        # a few min, quiet 2-core box
    /tmp/benchenv/bin/python benchmarks/vs_pytorch.py                # L = 256 and 1024, 7 rounds
    python benchmarks/vs_pytorch.py --smoke     # tiny model, L=16, one turn (CI; torch optional)
    python benchmarks/vs_pytorch.py --torch_python=/tmp/benchenv/bin/python \
        --jax 'onednn=flags=--xla_cpu_use_onednn=true' --jax 'bw128=model.attention=blockwise,model.block_size=128'

PyTorch comes from the optional `bench` extra in its own environment (`pip install -e
'.[train,bench]'`), never from the package or CI. The model (4 layers, E=256, 8 heads, SwiGLU
F=688, RoPE, tied embeddings, AdamW, clipping, float32, B=16) is ours through `train.step`
(JAX) and `benchmarks/torch_twin.py` (PyTorch). Each framework runs in its own worker process
(so each keeps its own thread pool and JAX its own XLA_FLAGS), compiled and warmed up first;
then the workers take turns, `--steps` updates each per turn, the order reversed every round,
for `--rounds` rounds. Each turn's time ends with one host read of the loss (no per-step
sync). Reported per length: median tokens/s of each worker and median tokens per CPU-second
of its process (steadier on a shared machine, though PyTorch's spinning OpenMP threads count
too), each with the median over rounds of the per-round ratio JAX / PyTorch (robust to load
that drifts between rounds), and the load average before and after: on an oversubscribed
machine PyTorch slows down far more than XLA, so only a quiet machine's ratios mean much.

A JAX variant is NAME=SPEC, SPEC a comma-separated list of `flags=XLA_FLAGS` (replacing our
defaults, empty for none) and `model.KEY=VALUE` overrides. The default variant `jax` runs our
defaults: `train.xla_flags.apply_cpu_defaults` and `train.xla_flags.cpu_attention(L)`.

Each JAX worker also times a float32 `jnp.dot` of two n x n matrices in its own process (the
same-run yardstick that needs no torch). `--smoke` (CI) runs a 1-layer E=32 model at L=16, one
turn of one step; where `--torch_python` has no torch it runs the JAX side alone and says, in
its output and its JSON (`"torch": "not run: ..."`), that the torch side was not run. A full
run without torch refuses to start.
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = {"vocab": 256, "layers": 4, "embed": 256, "heads": 8, "mlp": 688}
SMOKE_MODEL = {"vocab": 256, "layers": 1, "embed": 32, "heads": 2, "mlp": 64}
TAG = "@@"  # protocol lines from the workers start with this; everything else is log


def _send(obj) -> None:
    print(TAG + json.dumps(obj), flush=True)


def _parse_spec(spec: str) -> tuple[str | None, dict]:
    flags, overrides = None, {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key == "flags":
            flags = value
        elif key.startswith("model."):
            overrides[key[len("model."):]] = int(value) if value.isdigit() else value
        else:
            raise ValueError(f"bad variant item {item!r}: want flags=... or model.KEY=VALUE")
    return flags, overrides


def _matmul_gflops(n: int, repeats: int = 3) -> float:
    """Best-of-`repeats` float32 n x n @ n x n rate (GFLOP/s) on JAX's default device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def jax_worker(seq_len: int, batch: int, spec: str, model: dict, matmul_n: int):
    """Our train step (train.state + train.step) on a fixed random batch."""
    flags, overrides = _parse_spec(spec)
    sys.path.insert(0, str(ROOT))
    from train import xla_flags

    if flags is None:
        applied = xla_flags.apply_cpu_defaults()
    else:
        os.environ["XLA_FLAGS"] = applied = flags
    import jax
    import numpy as np

    from configs import default
    from train import sharding
    from train import state as state_lib
    from train import step as step_lib

    config = default.get_config()
    config.batch_size, config.seq_len = batch, seq_len
    config.learning_rate, config.warmup_steps, config.num_train_steps = 3e-4, 0, 10**6
    config.model.update(num_layers=model["layers"], embed_dim=model["embed"],
                        num_heads=model["heads"], mlp_dim=model["mlp"])
    attn = xla_flags.cpu_attention(seq_len) if "attention" not in overrides else {}
    config.model.update({**attn, **overrides})
    mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
    setup = state_lib.make_setup(config, mesh)
    train_step = step_lib.make_train_step(setup)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, model["vocab"], (batch, seq_len + 1), dtype=np.int32)
    data = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)),
            "segment_ids": np.zeros((batch, seq_len), np.int32),
            "weights": np.ones((batch, seq_len), np.float32)}
    data = jax.device_put({k: np.ascontiguousarray(v) for k, v in data.items()})
    state = state_lib.init_state(setup, seed=0)
    box = {"state": state, "metrics": None}

    def step():
        box["state"], box["metrics"] = train_step(box["state"], data)

    def sync():
        return float(box["metrics"]["loss"])

    m = setup.model_config
    desc = {"xla_flags": applied or "", "attention": m.attention, "block_size": m.block_size,
            "jax": jax.__version__, "matmul_n": matmul_n,
            "matmul_gflops_float32": _matmul_gflops(matmul_n)}
    return step, sync, desc


def torch_worker(seq_len: int, batch: int, spec: str, model: dict, matmul_n: int):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from torch_twin import TwinTrainer

    trainer = TwinTrainer(**model, batch=batch, seq_len=seq_len)
    return trainer.step, trainer.sync, {"torch": torch.__version__,
                                        "threads": torch.get_num_threads()}


def torch_missing(python: str) -> str | None:
    """None when `python` can import torch, else why not (one line)."""
    done = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                          check=False)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return f"{python} cannot import torch ({last}); install the bench extra"


def worker_main(kind: str, seq_len: int, batch: int, spec: str, warmup: int,
                smoke: bool) -> None:
    t = time.perf_counter()
    model, matmul_n = (SMOKE_MODEL, 128) if smoke else (MODEL, 2048)
    step, sync, desc = (jax_worker if kind == "jax" else torch_worker)(
        seq_len, batch, spec, model, matmul_n)
    for _ in range(max(warmup, 1)):  # the first step compiles
        step()
    loss = sync()
    _send({"ready": True, "setup_s": time.perf_counter() - t, "loss": loss, **desc})
    for line in sys.stdin:
        n = int(line)
        if n <= 0:
            return
        t, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        loss = sync()
        _send({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
               "loss": loss})


class Worker:
    def __init__(self, name: str, kind: str, python: str, seq_len: int, batch: int, spec: str,
                 warmup: int, smoke: bool):
        self.name = name
        cmd = [python, __file__, "--worker", kind, "--spec", spec, "--seq_len", str(seq_len),
               "--batch", str(batch), "--warmup", str(warmup)] + (["--smoke"] if smoke else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError(f"worker {self.name} exited with {self.proc.wait()}")

    def run(self, steps: int) -> dict:
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("0\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def measure(seq_len: int, args, variants: dict[str, str], *, with_torch: bool = True) -> dict:
    load_before = os.getloadavg()
    workers = ([Worker("torch", "torch", args.torch_python, seq_len, args.batch, "",
                       args.warmup, args.smoke)] if with_torch else [])
    workers += [Worker(n, "jax", args.jax_python, seq_len, args.batch, s, args.warmup,
                       args.smoke) for n, s in variants.items()]
    times = {w.name: [] for w in workers}
    try:
        for r in range(args.rounds):
            for w in (workers if r % 2 == 0 else workers[::-1]):
                times[w.name].append(w.run(args.steps))
    finally:
        for w in workers:
            w.close()
    tokens = args.steps * args.batch * seq_len
    out = {"seq_len": seq_len, "load_before": load_before, "load_after": os.getloadavg(),
           "workers": {}}
    for w in workers:
        entry = {**w.info}
        for key, what in (("seconds", "tokens_per_sec"), ("cpu_seconds", "tokens_per_cpu_sec")):
            rate = [tokens / t[key] for t in times[w.name]]
            entry[what] = statistics.median(rate)
            entry[what + "_per_round"] = rate
            if w.name != "torch" and with_torch:
                torch_rate = [tokens / t[key] for t in times["torch"]]
                entry[what + "_ratio"] = statistics.median(a / b for a, b in zip(rate,
                                                                                  torch_rate))
        out["workers"][w.name] = entry
    return out


def report(results: list[dict]) -> None:
    print(f"\n{'L':>5} {'worker':<10} {'tokens/s':>9} {'x torch':>8} {'tok/cpu-s':>9} "
          f"{'x torch':>8}  setup_s  config")
    for res in results:
        for name, e in res["workers"].items():
            r1, r2 = ((f"{e.get(k + '_ratio', 1):.2f}" if "torch" in res["workers"] else "n/a")
                      for k in ("tokens_per_sec", "tokens_per_cpu_sec"))
            conf = (f"{e['attention']}/{e['block_size']} flags='{e['xla_flags']}', "
                    f"matmul {e['matmul_n']}^3 {e['matmul_gflops_float32']:.1f} GFLOP/s"
                    if "attention" in e else f"torch {e['torch']}, {e['threads']} threads")
            print(f"{res['seq_len']:>5} {name:<10} {e['tokens_per_sec']:>9.0f} {r1:>8} "
                  f"{e['tokens_per_cpu_sec']:>9.0f} {r2:>8}  {e['setup_s']:>7.1f}  {conf}")
        if "torch" not in res["workers"]:
            print(f"      torch side {res['torch']}")
        print(f"      load average before {res['load_before'][0]:.2f}, after "
              f"{res['load_after'][0]:.2f} ({os.cpu_count()} cpus)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, L=16, B=2, one turn of one step; torch optional (CI)")
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="updates per turn")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--jax", action="append", default=[], metavar="NAME=SPEC")
    parser.add_argument("--no_default", action="store_true", help="omit the `jax` variant")
    parser.add_argument("--torch_python", default=sys.executable)
    parser.add_argument("--jax_python", default=sys.executable)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", default="", help=argparse.SUPPRESS)
    parser.add_argument("--seq_len", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker, args.seq_len, args.batch, args.spec, args.warmup,
                           args.smoke)
    if args.quick:
        args.rounds, args.steps, args.warmup = 3, 2, 1
    if args.smoke:
        args.lengths, args.batch, args.rounds, args.steps, args.warmup = "16", 2, 1, 1, 1
    missing = torch_missing(args.torch_python)
    if missing and not args.smoke:
        raise SystemExit(f"vs_pytorch: {missing} (or pass --torch_python=...); --smoke runs "
                         "the JAX side alone")
    if missing:
        print(f"torch side NOT run: {missing}; timing the JAX side only", flush=True)
    variants = {} if args.no_default else {"jax": ""}
    variants.update(v.split("=", 1) for v in args.jax)
    results = []
    for length in map(int, args.lengths.split(",")):
        results.append(measure(length, args, variants, with_torch=missing is None))
        if missing:
            results[-1]["torch"] = f"not run: {missing}"  # in the JSON too
        report(results[-1:])
    print("\nsummary")
    report(results)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

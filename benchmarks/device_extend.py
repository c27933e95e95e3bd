"""The device run's real-model sections: SmolLM2's extension table at 2C, LongRoPE's factor
search at 2C, and the table at 4C (`benchmarks/device_check.py` runs them, each in its own
process under its own time limit).

    extend_2c     `python -m train.extend --config=configs/extend_2c.py` in OUT/extend, in
                  STEPS_2C's order: the rows a CPU cannot afford first (passkey at 2C for the
                  methods the CPU run left out, then the code text), then the whole table, so a
                  budget that runs out cuts what the CPU already has
    longrope_2c   `python -m train.longrope` for SmolLM2 at 16,384 tokens (issue 35)
    extend_4c     the same config with `:4C` in the same workdir (the 2C jobs it shares are
                  reused: their fingerprints match)

On an accelerator the extension runs float32 with every matmul at full float32 precision
(JAX_DEFAULT_MATMUL_PRECISION=highest: NVIDIA's default TF32 moved the last run's
perplexities by 1-2%), XLA's dense attention and the blocks scanned (one layer compiled, not
30): DEVICE. Each step is resumable: rerun with OUT/extend carried back as the workdir.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "extend_2c.py"
ENV = {"JAX_DEFAULT_MATMUL_PRECISION": "highest"}

#: The smoke's overrides: the same config on the tiny random Llama (C = 64), two methods.
EXTEND_SMOKE = (
    f"--config.pretrained_dir={ROOT / 'tests/data/pretrained/tiny'}",
    "--config.model.smollm2.file=llama", "--config.model.smollm2.add_bos=True",
    "--config.methods=none,yarn", "--config.texts=prose", "--config.passkey.depths=0.5",
    "--config.passkey.keys_per_depth=1", "--config.passkey.max_new_tokens=6",
    "--config.calibrate_len=32", "--config.calibrate_attention_len=64",
    "--config.scan_layers=True")
#: How an accelerator runs the study (the docstring).
DEVICE = ("--config.attention=dense", "--config.scan_layers=True")
#: (label, overrides) in order; the last step is the whole 2C table.
STEPS_2C = (
    ("passkey_2c", ("--config.methods=linear,dynamic,longrope,llama3", "--config.texts=prose",
                    "--config.passkey.lengths=2C")),
    ("code", ("--config.texts=code", "--config.passkey.enabled=False")),
    ("all", ()),
)


def run_logged(cmd: list[str], log: pathlib.Path, timeout: float) -> str:
    """Runs `cmd` in the repository (ENV added) with its whole output in `log` (a killed
    run's too); returns "ok", "failed rc=N" or "timed out after T s (resumable: ...)"."""
    with open(log, "w") as f:
        try:
            p = subprocess.run(cmd, check=False, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout, env={**os.environ, **ENV})
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s (resumable: rerun the same command)"
    return "ok" if p.returncode == 0 else f"failed rc={p.returncode}"


def extend_steps(outdir: pathlib.Path, which: str, *, smoke: bool) -> list[tuple[str, list]]:
    """[(label, command)] of section `which` ('2C' or '4C'), all in OUT/extend. The smoke runs
    the tiny Llama (C = 64: too short for a passkey prompt below 4C, so its 2C steps have
    none) and one step per section."""
    base = [sys.executable, "-m", "train.extend", f"--config={CONFIG}:{which}",
            f"--workdir={outdir / 'extend'}"]
    if smoke:
        extra = ("--config.passkey.lengths=4C" if which == "4C"
                 else "--config.passkey.enabled=False")
        return [("all", [*base, *EXTEND_SMOKE, extra])]
    steps = STEPS_2C if which == "2C" else (("all", ()),)
    return [(label, [*base, *DEVICE, *over]) for label, over in steps]


def run_extend(which: str, shapes: dict, out, deadline: float, outdir: pathlib.Path) -> None:
    """Section extend_2c / extend_4c: its steps in order until the deadline; each step's
    status, command, log tail and report land in the section's JSON."""
    statuses = {}
    for label, cmd in extend_steps(outdir, which, smoke=shapes["smoke"]):
        key = f"{which}_{label}"
        left = deadline - time.time()
        if left < 10:
            statuses[key] = "skipped: no time left of the section's budget"
            out(f"status_{key}", statuses[key])
            continue
        log = outdir / f"extend_{key}.log"
        statuses[key] = run_logged(cmd, log, left)
        out(f"status_{key}", statuses[key])
        out(f"cmd_{key}", " ".join(cmd[1:]))
        out(f"tail_{key}", log.read_text(errors="replace").strip().splitlines()[-8:])
        report = outdir / "extend" / "report.md"
        if report.exists():
            out(f"report_{key}.md", report.read_text()[:6000])
    ok = all(s == "ok" for s in statuses.values())
    out("status", "ok" if ok else "incomplete: see the status_* entries")


def longrope_command(outdir: pathlib.Path, *, smoke: bool) -> list[str]:
    """`python -m train.longrope` (issue 35): LongRoPE's evolutionary search for SmolLM2 at
    2C = 16,384 tokens on the extension study's prose (`pydoc_data/topics.py`), float32 at full
    precision, dense attention, a small population. The smoke: the tiny Llama, 64 -> 128, one
    generation of three."""
    text = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    if smoke:
        ckpt, target = ROOT / "tests/data/pretrained/tiny/llama", 128
        search = ["--generations=1", "--population=3", "--parents=2", "--mutations=1",
                  "--crossovers=0"]
    else:
        ckpt, target = ROOT / ".pretrained" / "SmolLM2-135M-Instruct.Q4_1.gguf", 16384
        search = ["--generations=2", "--population=8", "--parents=4", "--mutations=3",
                  "--crossovers=2", "--dtype=float32", "--attention=dense"]
    return [sys.executable, "-m", "train.longrope", f"--checkpoint={ckpt}",
            f"--target_length={target}", f"--text={text}",
            f"--workdir={outdir / 'longrope_2c'}", "--starts=0", *search]


def run_longrope_2c(shapes: dict, out, deadline: float, outdir: pathlib.Path) -> None:
    """The search (`longrope_command`), resumable in OUT/longrope_2c; its log lines and
    result.json land in the section."""
    cmd = longrope_command(outdir, smoke=shapes["smoke"])
    out("cmd", " ".join(cmd[1:]))
    log = outdir / "longrope_2c.log"
    out("status", run_logged(cmd, log, max(deadline - time.time(), 10)))
    out("tail", log.read_text(errors="replace").strip().splitlines()[-12:])
    result = outdir / "longrope_2c" / "result.json"
    if result.exists():
        out("result", json.loads(result.read_text()))

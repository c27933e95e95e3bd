"""One prepared accelerator run: tests, RoPE bandwidth, attention table, train step, study.

    bash scripts/device_check.sh OUT            # one H200, about 8 minutes
    bash scripts/device_check.sh --smoke OUT    # the same on CPU with tiny shapes, < 3 min

$DEVICE_CHECK_SECTIONS (comma-separated) runs only those sections, the others recorded as
skipped. Section time limits are in FULL / SMOKE below (x $DEVICE_CHECK_BUDGET_SCALE, default 1: the
test sets 3, so a loaded CPU does not cut the smoke short). Writes OUT/device_check.json (keys platform, jax_version, device, mode, tests, rope,
attention, train, study, extend_finetune, extend_4c, seconds) and OUT/device_check.md. Each section runs in its own
process with its own time limit (so a crash, a hang or an out-of-memory in one part loses
nothing else; only one process holds the accelerator at a time) and writes what it has
measured as it goes: a section that fails is recorded with its error and partial results.
Sections are in `benchmarks/device_sections.py`; the study is `python -m train.study` with
`configs/study_ex5.py` (`:smoke` on CPU), run only when that config exists and time is left.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

FULL = {
    "numerics": (2, 1024, 8, 128), "block": 512, "rope": (4, 8192, 16, 128), "reps": 3,
    "matmul_n": 8192, "train_steps": 10, "train_batch": (16, 2048),
    "train_model": {"num_layers": 24, "embed_dim": 1024, "num_heads": 8, "mlp_dim": 3328,
                    "vocab_size": 256},
    "budget": {"tests": 60, "rope": 20, "attention": 100, "train": 80, "kernel": 100,
               "study": None, "extend_finetune": 300, "extend_4c": 250, "longrope_2c": 300},
    "extend_steps": 200,
    "total_budget": 500,  # seconds for all sections: the study gets what is left
    "smoke": False,
    "pytest": ["tests/model/test_pallas.py", "tests/encodings/test_precision.py"],
}
SMOKE = {
    "numerics": (1, 64, 2, 16), "block": 16, "rope": (1, 128, 2, 16), "reps": 2,
    "matmul_n": 128, "train_steps": 2, "train_batch": (2, 32),
    "train_model": {"num_layers": 2, "embed_dim": 32, "num_heads": 2, "mlp_dim": 64,
                    "vocab_size": 256},
    "budget": {"tests": 30, "rope": 15, "attention": 30, "train": 45, "kernel": 45,
               "study": None, "extend_finetune": 90, "extend_4c": 90, "longrope_2c": 60},
    "extend_steps": 3,
    "total_budget": 305,
    "pytest": [], "smoke": True,
}
SECTIONS = ("tests", "rope", "attention", "train", "kernel", "study", "extend_finetune",
            "extend_4c", "longrope_2c")


def run_section(name: str, shapes: dict, path: pathlib.Path, deadline: float,
                outdir: pathlib.Path) -> None:
    """In a child process: runs one section, rewriting `path` after every result."""
    from train import xla_flags

    xla_flags.apply_cpu_defaults()  # before the section starts JAX's backend
    import device_sections as sec

    result = dict(sec.platform_info())
    result["results"] = {}

    def out(key, value):
        result["results"][key] = value
        path.write_text(json.dumps(result, indent=1, default=str))

    out("_started", True)
    if name == "tests":
        sec.numerics(shapes, out)
        files = [f for f in shapes["pytest"] if (ROOT / f).exists()]
        if files:
            cmd = [sys.executable, "-m", "pytest", *files, "-q", "-x",
                   "-p", "no:cacheprovider"]
            left = max(deadline - time.time(), 10)
            try:
                p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True,
                                   text=True, timeout=left)
                out("pytest", {"cmd": " ".join(cmd[1:]), "rc": p.returncode,
                               "tail": p.stdout.strip().splitlines()[-3:]})
            except subprocess.TimeoutExpired:
                out("pytest", {"cmd": " ".join(cmd[1:]), "rc": None,
                               "tail": [f"timed out after {left:.0f} s"]})
    elif name == "rope":
        sec.rope(shapes, out)
    elif name == "attention":
        sec.attention(shapes, out)
    elif name == "train":
        sec.train(shapes, out, deadline)
    elif name == "kernel":  # head dims 64 / 96 / 256, Gemma 3's sliding window, block sweep
        import kernel_device

        kernel_device.run(kernel_device.SMOKE if shapes["smoke"] else kernel_device.FULL, out,
                          deadline)
    elif name == "study":
        run_study(shapes, out, deadline, outdir)
    elif name == "extend_finetune":
        run_extend_finetune(shapes, out, deadline, outdir)
    elif name == "extend_4c":
        run_extend_4c(shapes, out, deadline, outdir)
    elif name == "longrope_2c":
        run_longrope_2c(shapes, out, deadline, outdir)


def run_extend_finetune(shapes: dict, out, deadline: float, outdir: pathlib.Path) -> None:
    """The extension study's fine-tuned row (`python -m train.extend.finetune`): SmolLM2 +
    YaRN x4 fine-tuned at 32k; its JSON and markdown land in OUT."""
    cmd = [sys.executable, "-m", "train.extend.finetune", f"--out={outdir}",
           f"--steps={shapes['extend_steps']}"] + (["--smoke"] if shapes["smoke"] else [])
    left = deadline - time.time()
    try:
        p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True,
                           timeout=max(left, 10))
        out("status", "ok" if p.returncode == 0 else f"failed rc={p.returncode}")
        out("tail", (p.stdout + p.stderr).strip().splitlines()[-8:])
    except subprocess.TimeoutExpired:
        out("status", f"timed out after {left:.0f} s")
    out("cmd", " ".join(cmd[1:]))
    md = outdir / "extend_finetune.md"
    if md.exists():
        out("extend_finetune.md", md.read_text()[:6000])


def run_logged(cmd: list[str], log: pathlib.Path, timeout: float) -> str:
    """Runs `cmd` in the repository with its whole output in `log` (a killed run's too);
    returns "ok", "failed rc=N" or "timed out after T s (resumable: ...)"."""
    with open(log, "w") as f:
        try:
            p = subprocess.run(cmd, check=False, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s (resumable: rerun the same command)"
    return "ok" if p.returncode == 0 else f"failed rc={p.returncode}"


#: The smoke's overrides: the same config on the tiny random Llama (C = 64), two methods.
EXTEND_SMOKE = (
    f"--config.pretrained_dir={ROOT / 'tests/data/pretrained/tiny'}",
    "--config.model.smollm2.file=llama", "--config.model.smollm2.add_bos=True",
    "--config.methods=none,yarn", "--config.texts=prose", "--config.passkey.depths=0.5",
    "--config.passkey.keys_per_depth=1", "--config.passkey.max_new_tokens=6",
    "--config.calibrate_len=32", "--config.calibrate_attention_len=64")


def extend_commands(outdir: pathlib.Path, *, smoke: bool) -> list[list[str]]:
    """`python -m train.extend --config=configs/extend_2c.py` (the 2C table: every method,
    prose and code, passkey at C and 2C), then the same with `:4C` (lengths and passkey to
    4C = 32,768 tokens) in the same workdir, so the 4C run reuses every 2C job it shares (the
    job fingerprints match) and a budget that runs out cuts 4C, never 2C. The smoke runs both
    on the tiny Llama (C = 64; its 2C step without passkey, whose prompt needs 173 tokens)."""
    config = ROOT / "configs" / "extend_2c.py"
    cmds = []
    for arg in ("2C", "4C"):
        cmd = [sys.executable, "-m", "train.extend", f"--config={config}:{arg}",
               f"--workdir={outdir / 'extend_4c'}"]
        if smoke:  # C = 64 is too short for a passkey prompt below 4C
            cmd += [*EXTEND_SMOKE, "--config.passkey.lengths=4C" if arg == "4C"
                    else "--config.passkey.enabled=False"]
        cmds.append(cmd)
    return cmds


def run_extend_4c(shapes: dict, out, deadline: float, outdir: pathlib.Path) -> None:
    """The 2C table, then 4C (`extend_commands`); resumable, so a run cut by its budget
    continues on the next device run (carry OUT/extend_4c back as the workdir). Each step's
    report lands in OUT; `report.md` is the last one written."""
    statuses, reports = {}, {}
    for arg, cmd in zip(("2C", "4C"), extend_commands(outdir, smoke=shapes["smoke"])):
        left = deadline - time.time()
        if left < 10:
            statuses[arg] = "skipped: no time left of the section's budget"
            out(f"status_{arg}", statuses[arg])
            continue
        log = outdir / f"extend_{arg}.log"
        status = run_logged(cmd, log, left)
        out(f"tail_{arg}", log.read_text(errors="replace").strip().splitlines()[-8:])
        statuses[arg] = status
        out(f"status_{arg}", status)
        out(f"cmd_{arg}", " ".join(cmd[1:]))
        report = outdir / "extend_4c" / "report.md"
        if report.exists():
            reports[arg] = report.read_text()[:6000]
            out(f"report_{arg}.md", reports[arg])
    done = all(s == "ok" for s in statuses.values()) and len(statuses) == 2
    out("status", "ok" if done else "incomplete: see status_2C / status_4C")
    if reports:
        out("report.md", reports.get("4C", reports.get("2C")))


def longrope_command(outdir: pathlib.Path, *, smoke: bool) -> list[str]:
    """`python -m train.longrope` (issue 35): LongRoPE's evolutionary search for SmolLM2 at
    2C = 16,384 tokens on the extension study's prose (`pydoc_data/topics.py`), bfloat16,
    a small population (each candidate compiles once: the factors are static). The smoke:
    the tiny Llama, 64 -> 128, one generation of three."""
    text = pathlib.Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    if smoke:
        ckpt, target = ROOT / "tests/data/pretrained/tiny/llama", 128
        search = ["--generations=1", "--population=3", "--parents=2", "--mutations=1",
                  "--crossovers=0"]
    else:
        ckpt, target = ROOT / ".pretrained" / "SmolLM2-135M-Instruct.Q4_1.gguf", 16384
        search = ["--generations=4", "--population=12", "--parents=6", "--mutations=3",
                  "--crossovers=3", "--dtype=bfloat16", "--attention=blockwise"]
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


def run_study(shapes: dict, out, deadline: float, outdir: pathlib.Path) -> None:
    config = ROOT / "configs" / "study_ex5.py"
    if not config.exists():
        out("status", "skipped: configs/study_ex5.py is not in this checkout (issue 14)")
        return
    smoke = shapes["smoke"]
    # Outside OUT: its checkpoints (~130 MB a model with Adam state) must not travel back;
    # report.md and results.csv go into the JSON below.
    work = pathlib.Path(tempfile.mkdtemp(prefix="device_check_study_"))
    cmd = [sys.executable, "-m", "train.study",
           f"--config={config}" + (":smoke" if smoke else ""), f"--workdir={work}"]
    left = deadline - time.time()
    if left < 10:
        out("status", "skipped: no time left of the total budget")
        return
    try:
        p = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True,
                           timeout=left)
        out("status", "ok" if p.returncode == 0 else f"failed rc={p.returncode}")
        out("tail", (p.stdout + p.stderr).strip().splitlines()[-8:])
    except subprocess.TimeoutExpired:
        out("status", f"timed out after {left:.0f} s (resumable: rerun the same command)")
    out("cmd", " ".join(cmd[1:]))
    for name in ("report.md", "results.csv"):
        if (work / name).exists():
            out(name, (work / name).read_text()[:6000])


def drive(outdir: pathlib.Path, smoke: bool) -> dict:
    shapes = SMOKE if smoke else FULL
    (outdir / "sections").mkdir(parents=True, exist_ok=True)
    report = {"mode": "smoke" if smoke else "full"}
    start = time.time()
    scale = float(os.environ.get("DEVICE_CHECK_BUDGET_SCALE", "1"))  # for loaded machines
    only = os.environ.get("DEVICE_CHECK_SECTIONS")  # comma-separated; default: every section
    chosen = SECTIONS if not only else tuple(x.strip() for x in only.split(","))
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        raise ValueError(f"DEVICE_CHECK_SECTIONS names unknown sections {unknown}; "
                         f"the sections are {', '.join(SECTIONS)}")
    for name in SECTIONS:
        if name not in chosen:
            report[name] = {"section_status": f"skipped: not in DEVICE_CHECK_SECTIONS={only}",
                            "seconds": 0.0}
            continue
        budget = shapes["budget"][name]
        if budget is None:  # what is left of the total
            budget = max(shapes["total_budget"] - (time.time() - start) / scale, 5)
        budget *= scale
        path = outdir / "sections" / f"{name}.json"
        cmd = [sys.executable, __file__, "--section", name, "--out", str(outdir),
               "--deadline", str(time.time() + budget)] + (["--smoke"] if smoke else [])
        t = time.time()
        try:  # a grace period beyond the section's own deadline before it is killed
            p = subprocess.run(cmd, check=False, cwd=ROOT, timeout=budget + 30,
                               capture_output=True, text=True)
            status = "ok" if p.returncode == 0 else f"failed rc={p.returncode}"
            tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
        except subprocess.TimeoutExpired:
            status, tail = f"killed after {budget + 30} s", []
        part = json.loads(path.read_text()) if path.exists() else {}
        for key in ("platform", "jax_version", "device"):
            report.setdefault(key, part.get(key))
        entry = part.get("results", {})
        entry.pop("_started", None)
        report[name] = {"section_status": status, "seconds": time.time() - t, **entry}
        if status != "ok":
            report[name]["log_tail"] = tail
        print(f"[device_check] {name}: {status} in {time.time() - t:.0f} s", flush=True)
    report["seconds"] = time.time() - start
    return report


def markdown(r: dict) -> str:
    where = (f"{r.get('device')} ({r.get('platform')}), jax {r.get('jax_version')}, "
             f"{r['seconds']:.0f} s in all.")
    lines = [f"# Device check ({r['mode']})", "", where, ""]
    for name in SECTIONS:
        sec = r.get(name, {})
        lines += [f"## {name}: {sec.get('section_status')} ({sec.get('seconds', 0):.0f} s)", ""]
        rows = [(k, v) for k, v in sec.items() if k not in ("section_status", "seconds")]
        if name in ("tests", "attention", "train"):
            lines += ["| entry | status | numbers |", "| --- | --- | --- |"]
            for k, v in rows:
                if isinstance(v, dict):
                    nums = ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}"
                                     for a, b in v.items() if a not in ("status", "trace"))
                    lines.append(f"| {k} | {v.get('status', '')} | {nums} |")
                else:
                    lines.append(f"| {k} | | {v} |")
        else:
            for k, v in rows:
                shown = f"{v:.4g}" if isinstance(v, float) else v
                if isinstance(shown, str) and "\n" in shown:
                    lines += [f"- {k}:", "", "```", shown.strip(), "```"]
                else:
                    lines.append(f"- {k}: {shown}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    outdir = pathlib.Path(args.out).resolve()
    if args.section:
        shapes = SMOKE if args.smoke else FULL
        path = outdir / "sections" / f"{args.section}.json"
        return run_section(args.section, shapes, path, args.deadline, outdir)
    if args.smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    report = drive(outdir, args.smoke)
    (outdir / "device_check.json").write_text(json.dumps(report, indent=1, default=str))
    (outdir / "device_check.md").write_text(markdown(report))
    print(f"[device_check] wrote {outdir}/device_check.json and device_check.md")


if __name__ == "__main__":
    main()

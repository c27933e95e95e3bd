"""One prepared accelerator run: tests, RoPE bandwidth, attention table, train step, study.

    bash scripts/device_check.sh OUT            # one H200, about 8 minutes
    bash scripts/device_check.sh --smoke OUT    # the same on CPU with tiny shapes, < 3 min

$DEVICE_CHECK_SECTIONS (comma-separated) runs only those sections, the others recorded as
skipped. Section time limits are in FULL / SMOKE below (x $DEVICE_CHECK_BUDGET_SCALE, default 1: the
test sets 3, so a loaded CPU does not cut the smoke short). Writes OUT/device_check.json (keys platform, jax_version, device, mode, tests, rope,
attention, train, study, extend_finetune, extend_2c, longrope_2c, extend_4c, seconds) and OUT/device_check.md. Each section runs in its own
process with its own time limit (so a crash, a hang or an out-of-memory in one part loses
nothing else; only one process holds the accelerator at a time) and writes what it has
measured as it goes: a section that fails is recorded with its error and partial results.
$DEVICE_CHECK_GROUP (comma-separated; tests/test_device_check.py's CPU smoke) runs those
sections in one process instead, one after another, each with its own deadline.
Sections are in `benchmarks/device_sections.py` (the real-model ones in
`benchmarks/device_extend.py`); the study is `python -m train.study` with
`configs/study_ex5.py` (`:smoke` on CPU), run only when that config exists and time is left.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import device_extend  # noqa: E402  (no JAX: the sections start it in their own process)

FULL = {
    "numerics": (2, 1024, 8, 128), "block": 512, "rope": (4, 8192, 16, 128), "reps": 3,
    "matmul_n": 8192, "train_steps": 10, "train_batch": (16, 2048),
    "train_model": {"num_layers": 24, "embed_dim": 1024, "num_heads": 8, "mlp_dim": 3328,
                    "vocab_size": 256},
    "budget": {"tests": 60, "rope": 20, "attention": 100, "train": 80, "kernel": 100,
               "study": None, "extend_finetune": 300, "extend_2c": 250, "longrope_2c": 170,
               "extend_4c": 100},
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
               "study": None, "extend_finetune": 90, "extend_2c": 60, "longrope_2c": 60,
               "extend_4c": 60},
    "extend_steps": 3,
    "total_budget": 305,
    "pytest": [], "smoke": True,
}
SECTIONS = ("tests", "rope", "attention", "train", "kernel", "study", "extend_finetune",
            "extend_2c", "longrope_2c", "extend_4c")


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
    elif name in ("extend_2c", "extend_4c"):
        device_extend.run_extend(name[-2:].upper(), shapes, out, deadline, outdir)
    elif name == "longrope_2c":
        device_extend.run_longrope_2c(shapes, out, deadline, outdir)


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


def section_budget(name: str, shapes: dict, start: float, scale: float) -> float:
    """Seconds `name` may run: its budget, or (None) what is left of the total, x scale."""
    budget = shapes["budget"][name]
    if budget is None:  # what is left of the total
        budget = max(shapes["total_budget"] - (time.time() - start) / scale, 5)
    return budget * scale


def run_group(names: list[str], shapes: dict, start: float, outdir: pathlib.Path) -> None:
    """DEVICE_CHECK_GROUP: `names` one after another in this process, each with its own
    deadline; one that raises is recorded with its error and the next one runs."""
    scale = float(os.environ.get("DEVICE_CHECK_BUDGET_SCALE", "1"))
    for name in names:
        path, t = outdir / "sections" / f"{name}.json", time.time()
        try:
            run_section(name, shapes, path, t + section_budget(name, shapes, start, scale),
                        outdir)
            error = None
        except Exception:  # noqa: BLE001 -- recorded: one section never stops the rest
            error = traceback.format_exc().strip().splitlines()[-6:]
        part = json.loads(path.read_text()) if path.exists() else {"results": {}}
        part["group"] = {"seconds": time.time() - t, "error": error}
        path.write_text(json.dumps(part, indent=1, default=str))


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
        report[name] = {"section_status": f"skipped: not in DEVICE_CHECK_SECTIONS={only}",
                        "seconds": 0.0}
    # One process per section (crash isolation); DEVICE_CHECK_GROUP=a,b,... (the CPU smoke of
    # tests/test_device_check.py: JAX's starts cost more than its sections) runs those in one.
    together = [n.strip() for n in os.environ.get("DEVICE_CHECK_GROUP", "").split(",")]
    groups = []
    for name in (name for name in SECTIONS if name in chosen):
        if name not in together:
            groups.append([name])
        elif not any(name in g for g in groups):
            groups.append([n for n in SECTIONS if n in chosen and n in together])
    for group in groups:
        one = len(group) > 1
        budget = sum(section_budget(name, shapes, start, scale) for name in group)
        cmd = [sys.executable, __file__, "--section", ",".join(group), "--out", str(outdir),
               "--deadline", str(start if one else time.time() + budget)]
        t = time.time()
        try:  # a grace period beyond the section's own deadline before it is killed
            p = subprocess.run(cmd + (["--smoke"] if smoke else []), check=False, cwd=ROOT,
                               timeout=budget + 30, capture_output=True, text=True)
            ended = "ok" if p.returncode == 0 else f"failed rc={p.returncode}"
            ended_tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
        except subprocess.TimeoutExpired:
            ended, ended_tail = f"killed after {budget + 30} s", []
        for name in group:
            path = outdir / "sections" / f"{name}.json"
            part = json.loads(path.read_text()) if path.exists() else {}
            ran = part.pop("group", None)
            if one and ran is not None:  # this section's own outcome inside the process
                status = "ok" if ran["error"] is None else "failed: raised"
                tail, seconds = ran["error"] or [], ran["seconds"]
            else:
                status, tail, seconds = ended, ended_tail, time.time() - t
            for key in ("platform", "jax_version", "device"):
                report.setdefault(key, part.get(key))
            entry = part.get("results", {})
            entry.pop("_started", None)
            report[name] = {"section_status": status, "seconds": seconds, **entry}
            if status != "ok":
                report[name]["log_tail"] = tail
            print(f"[device_check] {name}: {status} in {seconds:.0f} s", flush=True)
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
    parser.add_argument("--section", help=argparse.SUPPRESS)  # one, or a comma-separated group
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # a group's: start
    args = parser.parse_args()
    outdir = pathlib.Path(args.out).resolve()
    if args.section:
        shapes = SMOKE if args.smoke else FULL
        names = args.section.split(",")
        if set(names) - set(SECTIONS):
            parser.error(f"--section: unknown {sorted(set(names) - set(SECTIONS))}")
        if len(names) > 1:
            return run_group(names, shapes, args.deadline, outdir)
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

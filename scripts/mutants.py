"""A small mutation check: hand-picked plausible bugs, each run against only its relevant tests.

    python scripts/mutants.py                 # every mutant (about 15 minutes on 2 cores)
    python scripts/mutants.py --only rope-    # the mutants whose name starts with rope-
    python scripts/mutants.py --list

Each mutant replaces one exact snippet of one file with a plausible bug (a sign, an
off-by-one, a forgotten factor or check). It is applied to a scratch copy of the working tree
(the files git tracks plus untracked ones it does not ignore), and the mutant's tests run
there with `pytest -x`: a failing test kills it. A surviving mutant is a blind spot of the
suite: write the test that kills it. A snippet that is no longer in its file (the code moved)
is reported as STALE: update the mutant. Not part of CI (issue 15).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


def m(name, path, old, new, *tests):
    return Mutant(name, path, old, new, tests)


ENC, MOD = "posenc_jax/encodings/", "posenc_jax/model/"
FAM = "posenc_jax/pretrained/families/"
FAM_TESTS = "tests/pretrained/test_pretrained_families.py"
SCALING = ENC + "rope_scaling/formulas.py"
MUTANTS = [
    # -- encodings
    m("rope-rotate-ignores-attention-factor", ENC + "rope.py",
      "attention_factor=float(factor))", "attention_factor=1.0)",
      "tests/encodings/test_blind_spots.py", "tests/encodings/test_rope.py", "tests/model/test_kv_cache.py"),
    m("rope-rotation-direction", ENC + "rope.py",
      "jnp.concatenate([-sin, sin], -1)", "jnp.concatenate([sin, -sin], -1)",
      "tests/encodings/test_rope.py", "tests/encodings/test_blind_spots.py"),
    m("rope-interleaved-partner", ENC + "rope.py",
      'if layout == "half" else i ^ 1', 'if layout == "half" else (i + 1) % (2 * r)',
      "tests/encodings/test_rope.py"),
    m("sinusoidal-sin-cos-swapped", ENC + "sinusoidal.py",
      "jnp.stack([sin, cos], axis=-1)", "jnp.stack([cos, sin], axis=-1)",
      "tests/encodings/test_sinusoidal.py"),
    m("learned-negative-position-wraps", ENC + "learned.py",
      "idx = jnp.where(positions < 0, max_len, positions)", "idx = positions",
      "tests/encodings/test_learned.py"),
    m("alibi-slopes-off-by-one", ENC + "alibi.py",
      "for i in range(1, n + 1)]", "for i in range(n)]", "tests/encodings/test_alibi.py"),
    m("alibi-signed-distance", ENC + "alibi.py",
      "return (jnp.maximum(k, q) - jnp.minimum(k, q)).astype(jnp.float32)",
      "return (q - k).astype(jnp.float32)", "tests/encodings/test_alibi.py", "tests/encodings/test_blind_spots.py"),
    m("t5-zero-distance-in-upper-half", ENC + "relative.py",
      "jnp.where(rel > 0, n, 0)", "jnp.where(rel >= 0, n, 0)", "tests/encodings/test_relative.py"),
    m("shaw-clip-off-by-one", ENC + "relative.py",
      "relative_positions(q_positions, k_positions), -k, k) + k  # [.., Lq, Lk]",
      "relative_positions(q_positions, k_positions), -k, k - 1) + k  # [.., Lq, Lk]",
      "tests/encodings/test_relative.py"),
    # -- RoPE scaling
    m("yarn-ramp-upper-clamp", SCALING,
      "/ (high - low), 0, 1)", "/ (high - low), 0, None)",
      "tests/encodings/test_rope_scaling.py", "tests/encodings/test_blind_spots.py"),
    m("yarn-mscale-ignored", SCALING,
      "0.1 * mscale * math.log(scale) + 1.0", "0.1 * math.log(scale) + 1.0",
      "tests/encodings/test_rope_scaling.py", "tests/encodings/test_hf_config.py"),
    m("llama3-bands-swapped", SCALING,
      "where(wavelen > length / low_freq_factor,", "where(wavelen > length / high_freq_factor,",
      "tests/encodings/test_rope_scaling.py", "tests/encodings/test_hf_config.py"),
    m("dynamic-ntk-shrinks-below-original", SCALING,
      "s = jnp.maximum(jnp.asarray(seq_len).astype(jnp.float32), jnp.float32(length))",
      "s = jnp.asarray(seq_len).astype(jnp.float32)",
      "tests/encodings/test_rope_scaling.py", "tests/encodings/test_hf_config.py"),
    m("longrope-threshold-off-by-one", SCALING,
      "jnp.asarray(seq_len) > original_max_position_embeddings",
      "jnp.asarray(seq_len) >= original_max_position_embeddings",
      "tests/encodings/test_rope_scaling.py", "tests/encodings/test_hf_config.py"),
    # -- attention and cache
    m("causal-mask-excludes-self", MOD + "scores.py",
      "mask = k_positions[:, None, None, :] <= q_positions", "mask = k_positions[:, None, None, :] < q_positions",
      "tests/model/test_attention.py"),
    m("blockwise-denominator-not-rescaled", MOD + "softmax_math.py",
      "alpha * l + jnp.sum(p, axis=-1, keepdims=True)", "l + jnp.sum(p, axis=-1, keepdims=True)",
      "tests/model/test_attention.py"),
    m("kernel-skips-key-block-starting-at-the-last-query", MOD + "kernels/vjp.py",
      "vis = vis & (k_min[:, None, :] <= q_max[:, :, None])",
      "vis = vis & (k_min[:, None, :] < q_max[:, :, None])",
      "tests/model/test_kernel_faults.py"),
    m("cache-index-advances-by-one", MOD + "kv_cache.py",
      "index=index + t,", "index=index + 1,", "tests/model/test_kv_cache.py"),
    m("cache-never-rebuilds-on-regime-switch", MOD + "kv_cache.py",
      "jnp.any(regimes != cache.regime))", "False)",
      "tests/model/test_kv_cache.py", "tests/encodings/test_rope_scaling.py"),
    m("token-ids-unchecked", "posenc_jax/checks.py",
      "    if bad.any():\n        index = tuple(int(i) for i in np.argwhere(bad)[0])\n"
      "        raise ValueError(f\"token id",
      "    if False:\n        index = tuple(int(i) for i in np.argwhere(bad)[0])\n"
      "        raise ValueError(f\"token id",
      "tests/test_hostile_inputs.py::test_library_refuses_by_name"),
    # -- loss and data
    m("loss-ignores-weights", "train/step.py",
      "return jnp.sum(ce * weights), jnp.sum(weights)", "return jnp.sum(ce), jnp.sum(weights)",
      "tests/encodings/test_blind_spots.py"),
    m("packed-scores-document-starts", "train/data.py",
      "        weights *= doc[:, 1:] == doc_in\n", "", "tests/train/test_data.py"),
    m("packed-positions-from-document-start", "train/data.py",
      "segment_start = np.maximum(stream.doc_starts[doc_in], starts[:, None])",
      "segment_start = stream.doc_starts[doc_in]", "tests/train/test_data.py"),
    # -- checkpoints and the workdir
    m("checkpoint-fingerprint-unchecked", "train/checkpoint.py",
      'if "fingerprint" in meta and got != int(meta["fingerprint"]):', "if False:",
      "tests/train/test_train_faults.py::test_silent_corruption_is_caught_by_the_fingerprint"),
    m("checkpoint-restores-oldest-first", "train/checkpoint.py",
      "for step in reversed(steps):", "for step in steps:",
      "tests/train/test_train_faults.py::test_corrupt_newest_checkpoint_falls_back"),
    m("checkpoint-mismatch-quarantines", "train/checkpoint.py",
      "                    check_meta(step, meta)  # a mismatch",
      "                    pass  # check_meta(step, meta)  # a mismatch",
      "tests/train/test_train_faults.py::test_config_mismatch_refuses_and_touches_nothing"),
    m("workdir-lock-shared", "train/workdir_lock.py",
      "fcntl.LOCK_EX | fcntl.LOCK_NB", "fcntl.LOCK_SH | fcntl.LOCK_NB",
      "tests/train/test_train_faults.py::"
      "test_second_run_on_a_workdir_is_refused_and_a_killed_run_leaves_no_lock"),
    # -- a family's config mapping: per-layer windows (issue 34's survivors)
    m("families-qwen-window-off-by-one", FAM + "mapping.py",
      '"sliding_attention" if i >= flat["max_window_layers"]',
      '"sliding_attention" if i > flat["max_window_layers"]', FAM_TESTS),
    m("families-qwen-ignores-use-sliding-window", FAM + "mapping.py",
      'if not flat.get("use_sliding_window") or w is None:', "if w is None:", FAM_TESTS),
    m("families-sliding-full-swapped", FAM + "mapping.py",
      'return [w if t == "sliding_attention" else None for t in types]',
      'return [w if t != "sliding_attention" else None for t in types]', FAM_TESTS),
    m("families-qwen-ignores-layer-types", FAM + "mapping.py",
      'types = flat.get("layer_types") or [', "types = [", FAM_TESTS),
    m("families-mistral-drops-window", FAM + "mistral.py", 'windows="all",', 'windows="none",',
      FAM_TESTS),
    m("families-phi3-drops-window", FAM + "phi3.py", 'windows="all",', 'windows="none",',
      FAM_TESTS),
    m("families-gemma3-window-on-every-layer", FAM + "gemma3.py", 'windows="layer_types",',
      'windows="all",', FAM_TESTS),
    m("families-qwen-class-default-0", FAM + "qwen2.py",
      '"use_sliding_window": False, "max_window_layers": 28},',
      '"use_sliding_window": False, "max_window_layers": 0},', FAM_TESTS),
    m("families-gguf-gemma3-pattern-off-by-one", FAM + "gemma3.py",
      '"full_attention" if (i + 1) % pattern == 0', '"full_attention" if i % pattern == 0',
      FAM_TESTS),
    m("families-export-qwen-first-window", "posenc_jax/pretrained/export_config.py",
      '"max_window_layers": first}', '"max_window_layers": first + 1}', FAM_TESTS),
    m("families-export-qwen-drops-layer-types", "posenc_jax/pretrained/export_config.py",
      "if any(w is None for w in (windows or ())[first:]):", "if False:", FAM_TESTS),
    m("families-phi3-fused-order", FAM + "phi3.py",
      'tuple((*llama.ATTN, f"{x}_proj") for x in "qkv")',
      'tuple((*llama.ATTN, f"{x}_proj") for x in "kqv")', FAM_TESTS),
]


def working_tree() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def run_mutant(mutant: Mutant, files: list[str], timeout: float) -> tuple[str, float, str]:
    """-> (KILLED | SURVIVED | STALE | TIMEOUT, seconds, last line of pytest's output)."""
    source = (ROOT / mutant.path).read_text()
    if source.count(mutant.old) != 1:
        return "STALE", 0.0, f"snippet found {source.count(mutant.old)} times in {mutant.path}"
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        for rel in files:
            dst = pathlib.Path(scratch, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst)
        pathlib.Path(scratch, mutant.path).write_text(source.replace(mutant.old, mutant.new))
        env = {**os.environ, "PYTHONPATH": scratch, "PYTHONDONTWRITEBYTECODE": "1"}
        start = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                 *mutant.tests], cwd=scratch, env=env, capture_output=True, text=True,
                timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return "TIMEOUT", time.monotonic() - start, "tests ran past the timeout"
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        last = lines[-1] if lines else proc.stderr.strip()[-200:]
        if proc.returncode == 0:
            return "SURVIVED", time.monotonic() - start, last
        if proc.returncode in (4, 5):  # usage error / no tests collected: not a kill
            return "STALE", time.monotonic() - start, last
        return "KILLED", time.monotonic() - start, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run mutants whose name starts with this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    args = parser.parse_args()
    chosen = [mu for mu in MUTANTS if mu.name.startswith(args.only)]
    if args.list:
        for mu in chosen:
            print(f"{mu.name:42s} {mu.path}  <- {' '.join(mu.tests)}")
        return 0
    files = working_tree()
    results = []
    for mu in chosen:
        status, seconds, detail = run_mutant(mu, files, args.timeout)
        results.append(status)
        print(f"{status:8s} {seconds:6.1f}s  {mu.name:42s} {detail[:90]}", flush=True)
    killed = sum(s in ("KILLED", "TIMEOUT") for s in results)
    print(f"\nkilled {killed} of {len(results)} mutants "
          f"({100.0 * killed / max(len(results), 1):.0f}%); "
          f"survived {results.count('SURVIVED')}, stale {results.count('STALE')}")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

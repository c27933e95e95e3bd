"""Our exports, loaded by transformers, give our logits (no torch here: the golden file).

scripts/make_export_golden.py (torch + transformers 5.24, the throwaway golden venv) exported
each case of scripts/export_cases.py and recorded transformers' logits of the directory. Here
each case is exported again: its files must be byte for byte the ones transformers loaded
(sha256), and our model's logits -- the source's and those of the export read back by our own
loader -- must match transformers' (the first 1,024 vocab columns at every position, and the
maximum and argmax over the whole vocabulary).

The real SmolLM2-135M extended with YaRN x2 needs its GGUF file ($POSENC_PRETRAINED_DIR or
<repo>/.pretrained, `bash scripts/fetch_pretrained.sh DIR`).
"""

import hashlib
import importlib.util
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from posenc_jax.pretrained.loader import build
from posenc_jax.pretrained.safetensors_io import open_safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "pretrained" / "export"
TABLE = json.loads((GOLDEN / "golden.json").read_text())
ARRAYS = np.load(GOLDEN / "golden.npz")
#: max |ours - transformers| allowed: float32 sums in another order (30 layers for SmolLM2)
TOLERANCE = {"smollm2_yarn": 2e-3}
pytestmark = pytest.mark.filterwarnings("ignore:the load_module")


def _cases_module():
    spec = importlib.util.spec_from_file_location("export_cases",
                                                  ROOT / "scripts" / "export_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _cases_module()


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compare(name: str, logits: np.ndarray) -> float:
    golden = ARRAYS[f"{name}__logits"]
    tol = TOLERANCE.get(name, 1e-4)
    diff = float(np.abs(logits[..., :golden.shape[-1]] - golden).max())
    assert diff <= tol, f"{name}: max |ours - transformers| = {diff:.3g} > {tol}"
    np.testing.assert_allclose(logits.max(-1), ARRAYS[f"{name}__max"], atol=tol, rtol=0)
    picked = np.take_along_axis(logits, ARRAYS[f"{name}__argmax"][..., None], -1)[..., 0]
    assert (picked >= logits.max(-1) - 2 * tol).all()  # transformers' argmax is ours (ties)
    return diff


# XLA's defaults: the `trained` case's file hash is of weights trained by XLA's optimised
# programs (cheap compiles round differently), and SmolLM2's forward runs long (tests/conftest.py)
@pytest.mark.optimized_compile
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "smollm2_yarn" else n
    for n in sorted(TABLE["cases"])])
def test_transformers_logits_of_our_export(name, tmp_path):
    if name == "smollm2_yarn" and not (CASES.REAL_DIR / CASES.SMOLLM2).is_file():
        pytest.skip(f"{CASES.REAL_DIR / CASES.SMOLLM2} absent: run "
                    f"`bash scripts/fetch_pretrained.sh {CASES.REAL_DIR}`")
    recorded = TABLE["cases"][name]
    out = tmp_path / name
    model, tokens = CASES.export_case(name, out)
    assert tokens.tolist() == recorded["tokens"]
    files = {p.name: _sha256(p) for p in sorted(out.iterdir())}
    assert files == recorded["files"], (
        f"{name}: the export is not the one transformers loaded; if the change is meant, rerun "
        "scripts/make_export_golden.py in the golden venv")
    _compare(name, np.asarray(model(jnp.asarray(tokens))))
    back, _, _ = build(open_safetensors(out), attention="dense")
    _compare(name, np.asarray(back(jnp.asarray(tokens))))


def test_every_export_case_is_in_the_golden():
    assert sorted(TABLE["cases"]) == sorted(CASES.CASES)
    assert TABLE["versions"]["transformers"].startswith("5.")

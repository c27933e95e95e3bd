"""Moved public names stay reachable from their old place for a release, with a
DeprecationWarning (issue 26): `import posenc_jax.hf_config` (the module moved to
posenc_jax.encodings.hf_config) and `posenc_jax.rope_scaling.from_hf_config` (moved to
hf_config; removed in issue 29). The documented paths (`from posenc_jax import hf_config`) warn about nothing.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import posenc_jax
from posenc_jax.encodings import hf_config, rope_scaling

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_import_posenc_jax_hf_config_works_and_warns():
    # a fresh process: the warning comes once, at the first import
    done = _run("import posenc_jax.hf_config")
    assert done.returncode == 1 and "DeprecationWarning" in done.stderr
    assert "posenc_jax.encodings.hf_config" in done.stderr
    done = _run("import warnings; warnings.simplefilter('ignore')\n"
                "import posenc_jax.hf_config as old\n"
                "from posenc_jax.encodings import hf_config as new\n"
                "assert all(getattr(old, n) is getattr(new, n) for n in new.__all__)\n"
                "print(sorted(new.__all__) == sorted(old.__all__))")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_the_documented_path_does_not_warn():
    done = _run("from posenc_jax import hf_config\nimport posenc_jax\n"
                "print(posenc_jax.hf_config.__name__, hf_config.__name__)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["posenc_jax.encodings.hf_config"] * 2


def test_rope_scaling_from_hf_config_is_gone():
    """Its one release of grace is over (issue 29): the name lives in hf_config only."""
    with pytest.raises(AttributeError, match="has no attribute 'from_hf_config'"):
        rope_scaling.from_hf_config  # noqa: B018
    assert callable(hf_config.from_hf_config)


def test_every_module_the_readme_names_resolves():
    named = set(re.findall(r"posenc_jax\.([a-z_]+)", (ROOT / "README.md").read_text()))
    modules = named & set(posenc_jax._MODULES)
    assert "hf_config" in modules
    for name in sorted(modules):
        assert getattr(posenc_jax, name).__name__ == posenc_jax._MODULES[name], name

"""XLA flag defaults of the entry points: set only when the user set none, never at import,
and never flags under which our programs fail to compile (the oneDNN reproducer of
`train.xla_flags`, a dense and a blockwise train-step gradient run under them)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from train import xla_flags

PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from flax import nnx
    from posenc_jax.model.transformer import Transformer, TransformerConfig
    a = jnp.ones((16, 16))
    print(float(jax.jit(lambda a, b: jnp.dot(a * 2.0, b))(a, a).sum()))  # oneDNN reproducer
    for attention in ("dense", "blockwise"):
        cfg = TransformerConfig(vocab_size=32, num_layers=1, embed_dim=16, num_heads=2,
                                mlp_dim=32, attention=attention, block_size=8)
        g, p = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
        loss = lambda p: jnp.mean(nnx.merge(g, p)(jnp.zeros((1, 24), jnp.int32)) ** 2)
        jax.block_until_ready(jax.jit(jax.grad(loss))(p))
    print("ok")
""")


def test_defaults_only_when_unset(monkeypatch):
    monkeypatch.setattr(xla_flags, "DEFAULT_CPU_FLAGS", "--xla_cpu_enable_fast_math=false")
    env = {}
    assert xla_flags.apply_cpu_defaults(env) == "--xla_cpu_enable_fast_math=false"
    assert env == {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    for users in ("", "--xla_force_host_platform_device_count=2"):
        env = {"XLA_FLAGS": users}
        assert xla_flags.apply_cpu_defaults(env) is None and env == {"XLA_FLAGS": users}
    monkeypatch.setattr(xla_flags, "DEFAULT_CPU_FLAGS", "")
    env = {}
    assert xla_flags.apply_cpu_defaults(env) is None and env == {}


ENTRIES = ("train.__main__", "train.study.__main__")


@pytest.fixture(scope="module")
def environ_changes() -> dict:
    """{entry: the os.environ keys its import changed}, from one process importing the library
    then each entry in turn (one interpreter start, not one per entry): the snapshot before an
    entry is taken after everything imported before it."""
    # Some of our dependencies set variables when imported (orbax-checkpoint 0.12.8 and grain
    # 0.2.18 set TF_CPP_MIN_LOG_LEVEL and TPU_SKIP_MDS_QUERY; tensorboardX CRC32C_SW_MODE): the
    # snapshot is taken after them, so what is checked is that our own modules change nothing.
    code = ("import importlib, json, os, orbax.checkpoint, grain, tensorflow_datasets, "
            "tensorboardX\nout = {}\n"
            f"for entry in ('', *{ENTRIES!r}):\n"
            "    before = dict(os.environ)\n"
            "    if entry: importlib.import_module(entry)\n"
            "    else: importlib.import_module('posenc_jax.model.transformer'); "
            "importlib.import_module('train.xla_flags')\n"
            "    out[entry] = sorted(k for k in set(before) | set(os.environ) "
            "if before.get(k) != os.environ.get(k))\n"
            "print(json.dumps(out))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("entry", ENTRIES)
def test_importing_the_library_and_the_entry_points_changes_no_environment(entry,
                                                                          environ_changes):
    assert environ_changes[""] == [], f"import changed os.environ: {environ_changes['']}"
    changed = environ_changes[entry]
    assert changed == [], f"import of {entry} changed os.environ: {changed}"


@pytest.mark.parametrize("seq_len,attention", [(64, "dense"), (512, "dense"),
                                               (1024, "blockwise"), (8192, "blockwise")])
def test_cpu_attention_by_length(seq_len, attention):
    assert xla_flags.cpu_attention(seq_len)["attention"] == attention


def test_default_flags_compile_everything_we_run():
    env = {**os.environ, "XLA_FLAGS": xla_flags.DEFAULT_CPU_FLAGS, "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, "-c", PROGRAM], check=False, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (
        f"rc={p.returncode} under XLA_FLAGS={xla_flags.DEFAULT_CPU_FLAGS!r}: "
        f"{p.stdout[-500:]} {p.stderr[-1500:]}")

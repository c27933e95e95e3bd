"""The trainer starting from a pretrained checkpoint (issue 30): configs/extend_finetune.py on
the tiny checkpoints of tests/data/pretrained/tiny.

- three steps on a (data 2, context 2, fsdp 2) mesh of 8 CPU devices give the one-device
  losses, loss for loss (1e-4), full fine-tune and LoRA alike (llama full and gemma3_text LoRA
  here, each family both ways with POSENC_TEST_FULL=1: 90 s a case on 2 loaded cores);
- LoRA: the frozen base stays bit-identical to the checkpoint's weights, the optimizer holds
  moments for the adapters alone, and `python -m train.export`'s merged model loads (through
  `posenc_jax.pretrained.load`) with the LoRA model's logits and the run's new rope_scaling;
- the chunked loss gives the full loss's steps;
- errors naming what is wrong: a model key that contradicts the checkpoint (both values), a
  missing checkpoint, a tokenizer that is not the model's, an unknown LoRA target.
"""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc_jax import pretrained
from train import checkpoint, export, from_checkpoint, sharding, state, trainer
from train.evaluation import load_model
from train.extend import finetune

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "pretrained" / "tiny"
CI_CASES = {("llama", False), ("gemma3_text", True)}  # the rest: POSENC_TEST_FULL=1
MESH_CASES = [pytest.param(f, lora, marks=() if (f, lora) in CI_CASES else pytest.mark.full,
                           id=f"{f}-{'lora' if lora else 'full'}")
              for f in ("llama", "gemma3_text", "mistral", "qwen2", "qwen3", "phi3")
              for lora in (False, True)]
MESH = {"data": 2, "context": 2, "fsdp": 2, "tensor": 1}


def ft_config(data_dir, family="llama", **overrides):
    """configs/extend_finetune.py on a tiny checkpoint: 3 steps of 4 x 32 tokens, every step
    logged, no eval (the bytes tokenizer for checkpoints without tokenizer.json)."""
    config = finetune.base_config()
    config.init.checkpoint = str(TINY / family)
    config.num_train_steps, config.batch_size, config.seq_len = 3, 4, 32
    config.learning_rate, config.warmup_steps, config.log_every_steps = 1e-2, 0, 1
    config.checkpoint_every_steps, config.loss_chunk = 1, 8
    config.model.attention = "blockwise"
    config.model.block_size = 16
    config.dataset.data_dir = str(data_dir)
    config.dataset.max_tokens = 50_000
    if not (TINY / family / "tokenizer.json").is_file():
        config.dataset.tokenizer, config.dataset.eos_join = "bytes", False
    config.eval.lengths = ()
    config.mesh.update({"data": 1, "context": 1, "fsdp": 1, "tensor": 1})
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


@nnx.jit
def forward(model, tokens):
    """Logits as one compiled program (not op by op)."""
    return model(tokens)


def losses(workdir) -> list[float]:
    lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if line.strip()]


def saved(config, workdir):
    setup = state.make_setup(config, sharding.make_mesh(config.mesh, devices=jax.devices()[:1]))
    ckpt = checkpoint.Checkpointer(str(pathlib.Path(workdir) / "checkpoints"), async_save=False)
    try:
        return setup, checkpoint.to_numpy(ckpt.restore(ckpt.latest_step(), setup.abstract)[0])
    finally:
        ckpt.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def one_device(data_dir, tmp_path_factory):
    """-> run(family, lora, loss_chunk): the workdir of that one-device run, each config run
    once per module (the llama full fine-tune with loss_chunk=8 is both the mesh test's
    one-device run and the chunked loss's run)."""
    done = {}

    def run(family="llama", lora=False, loss_chunk=8):
        key = (family, lora, loss_chunk)
        if key not in done:
            workdir = tmp_path_factory.mktemp(f"one-{family}-{lora}-{loss_chunk}")
            config = ft_config(data_dir, family, **{"lora.enabled": lora,
                                                    "loss_chunk": loss_chunk})
            trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1],
                                       progress=False)
            done[key] = workdir
        return done[key]
    return run


@pytest.mark.parametrize("family,lora", MESH_CASES)
def test_mesh_of_8_gives_the_one_device_losses(data_dir, one_device, tmp_path, family, lora):
    eight = ft_config(data_dir, family, **{"lora.enabled": lora})
    eight.mesh.update(MESH)
    trainer.train_and_evaluate(eight, str(tmp_path / "eight"), progress=False)
    a, b = losses(one_device(family, lora)), losses(tmp_path / "eight")
    assert len(a) == 3 and a[0] != a[-1]  # it trains
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)


def test_chunked_loss_gives_the_full_loss_steps(one_device):
    np.testing.assert_allclose(losses(one_device(loss_chunk=8)), losses(one_device(loss_chunk=0)),
                               rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def lora_run(data_dir, tmp_path_factory):
    """Three LoRA steps (rank 4, LongLoRA's trainable norms) from the tiny llama with YaRN x2,
    measured as the extension study measures (buckets over 128 tokens, passkey at 256)."""
    workdir = tmp_path_factory.mktemp("lora")
    config = ft_config(data_dir, **{"lora.enabled": True, "lora.rank": 4,
                                    "lora.train_norms": True, "init.rope_scaling": "yarn:2",
                                    "eval.extension.enabled": True,
                                    "eval.extension.length": 128,
                                    "eval.extension.passkey_lengths": (256,)})
    trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1], progress=False)
    return config, workdir


def test_lora_leaves_the_base_bit_identical(lora_run):
    config, workdir = lora_run
    setup, final = saved(config, workdir)
    base = pretrained.load(TINY / "llama").model
    original = checkpoint.to_numpy(nnx.to_pure_dict(nnx.state(base, nnx.Param)))
    flat = jax.tree_util.tree_flatten_with_path(final["frozen"])[0]
    assert len(flat) > 10
    for path, leaf in flat:
        ref = original
        for key in path:
            ref = ref[key.key]
        assert leaf.dtype == ref.dtype and np.array_equal(leaf, ref), path
    assert set(final["params"]) == {"adapters", "base"}
    trained_base = jax.tree_util.tree_flatten_with_path(final["params"]["base"])[0]
    assert trained_base and all(any(str(k.key).endswith("norm") for k in p)
                                for p, _ in trained_base)  # LongLoRA: the norms train
    adapters = jax.tree.leaves(final["params"]["adapters"])
    assert any(np.abs(x).max() > 0 for x in adapters[1::2])  # B moved off zero
    moments = jax.tree.leaves(final["opt_state"])
    assert sum(x.size for x in moments) < 3 * sum(x.size for x in jax.tree.leaves(
        final["params"])) + 16  # state only for what trains (mu, nu, count)


def test_extension_measures_are_logged_and_reported(lora_run):
    _, workdir = lora_run
    last = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    buckets = ["extend/ppl/0-16", "extend/ppl/16-32", "extend/ppl/32-64", "extend/ppl/64-128"]
    for key in (*buckets, "extend/ppl", "extend/passkey/256"):
        assert np.isfinite(last.get(key, np.nan)), (key, sorted(last))
    report = json.loads((workdir / "extension_report.json").read_text())
    assert set(report["before"]) == set(report["after"]) == {*buckets, "extend/ppl",
                                                             "extend/passkey/256"}
    assert report["before"]["extend/ppl"] != report["after"]["extend/ppl"]  # it trained
    table = (workdir / "extension_report.md").read_text()
    assert "| extend/ppl/64-128 |" in table and "before / after" in table


def test_lora_export_is_merged_with_the_new_rope_scaling(lora_run, tmp_path):
    config, workdir = lora_run
    files = export.export(str(workdir), str(tmp_path / "hf"))
    assert "config.json" in files and "tokenizer.json" in files
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    scaling = written["rope_scaling"]
    assert scaling["rope_type"] == "yarn" and scaling["factor"] == 2.0
    assert written["max_position_embeddings"] == 128  # 2 x the checkpoint's 64
    model, _ = load_model(str(workdir), mesh=sharding.make_mesh(
        {"data": 1}, devices=jax.devices()[:1]))
    back = pretrained.load(tmp_path / "hf", attention="blockwise")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 320, (2, 48)), jnp.int32)
    ours = np.asarray(forward(model, tokens))
    np.testing.assert_allclose(np.asarray(forward(back.model, tokens)), ours, rtol=0, atol=1e-5)
    base = forward(pretrained.load(TINY / "llama", attention="blockwise",
                                   rope_scaling=scaling).model, tokens)
    assert np.abs(np.asarray(base) - ours).max() > 1e-4  # not the base


def test_a_model_key_that_contradicts_the_checkpoint_names_both(data_dir):
    config = ft_config(data_dir, **{"model.num_layers": 3})
    with pytest.raises(ValueError, match=r"config.model.num_layers=3 contradicts the checkpoint "
                                         r".*tiny/llama, whose num_layers is 2"):
        trainer.train_and_evaluate(config, "/nonexistent/never-written")
    ok = ft_config(data_dir, **{"model.num_layers": 2, "model.dtype": "bfloat16"})
    assert state.model_config_of(ok).dtype == "bfloat16"  # agreeing / fine-tune keys pass


def test_a_missing_checkpoint_is_named(data_dir, tmp_path):
    config = ft_config(data_dir, **{"init.checkpoint": str(tmp_path / "nope.gguf")})
    with pytest.raises(FileNotFoundError, match=r"config.init.checkpoint='.*nope.gguf': no such"):
        trainer.train_and_evaluate(config, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_a_tokenizer_that_is_not_the_models_is_refused(data_dir, tmp_path):
    fake = tmp_path / "small"
    shutil.copytree(TINY / "llama", fake)
    cfg = json.loads((fake / "config.json").read_text())
    cfg["vocab_size"] = 300
    (fake / "config.json").write_text(json.dumps(cfg))  # weights never read: checked first
    config = ft_config(data_dir, **{"init.checkpoint": str(fake)})
    with pytest.raises(ValueError, match=r"tokenizer .* has 320 ids, more than the model's "
                                         r"vocab_size=300"):
        trainer.train_and_evaluate(config, str(tmp_path / "w"), devices=jax.devices()[:1])


def test_rope_scaling_and_lora_keys_are_checked(data_dir):
    with pytest.raises(ValueError, match=r"config.lora.targets='q_proj,qq' names 'qq'"):
        state.make_setup(ft_config(data_dir, **{"lora.enabled": True,
                                                 "lora.targets": "q_proj,qq"}),
                         sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]))
    with pytest.raises(ValueError, match=r"config.init.rope_scaling='yarn:x'"):
        from_checkpoint.model_config(ft_config(data_dir, **{"init.rope_scaling": "yarn:x"}))
    cfg, hf = from_checkpoint.model_config(ft_config(
        data_dir, **{"init.rope_scaling": "{'rope_type': 'linear', 'factor': 2.0}"}))
    assert hf["rope_scaling"]["rope_type"] == "linear" and cfg.num_layers == 2

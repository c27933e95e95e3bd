"""Kernel block sizes: validated per platform and pass (errors name the field and value),
defaults by head dim, settable from TransformerConfig, and the lowered kernels use them.

Lowering is cross-platform from this CPU host on abstract arrays: nothing is allocated."""

import re

import jax
import jax.numpy as jnp
import pytest

import posenc_jax
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.kernels import (GpuBlocks, KernelBlocks, TpuBlocks, flash_attention,
                                      kernel_blocks)
from posenc_jax.model.kernels.blocks import default_blocks


@pytest.mark.parametrize(("cls", "field", "value", "words"), [
    (GpuBlocks, "block_q", 48, "GpuBlocks.block_q must be a power of two in [16, 256], got "
                               "block_q=48"),
    (GpuBlocks, "block_k_dkv", 8, "block_k_dkv=8"),
    (GpuBlocks, "num_warps", 3, "GpuBlocks.num_warps must be one of 1, 2, 4, 8, 16, got "
                                "num_warps=3"),
    (GpuBlocks, "num_stages", 0, "num_stages=0"),
    (TpuBlocks, "block_k", 64, "TpuBlocks.block_k must be a power of two in [128, 2048], got "
                               "block_k=64"),
    (TpuBlocks, "block_q_dq", 4, "block_q_dq=4"),
])
def test_invalid_blocks_name_the_field_and_value(cls, field, value, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        cls(**{field: value})


def test_non_int_blocks_are_type_errors():
    with pytest.raises(TypeError, match="GpuBlocks.block_q must be an int, got block_q=64.0"):
        GpuBlocks(block_q=64.0)
    with pytest.raises(TypeError, match="num_warps=True"):
        GpuBlocks(num_warps=True)


def test_defaults_by_head_dim():
    assert default_blocks("gpu", 64).block_q == 128 and default_blocks("gpu", 64).num_warps == 4
    assert default_blocks("gpu", 128) == GpuBlocks(num_warps=8)
    assert default_blocks("gpu", 256).block_k_dkv == 32
    assert default_blocks("tpu", 256) == TpuBlocks()


def test_kernel_blocks_from_dicts_and_values_resolve_against_the_defaults():
    kb = kernel_blocks({"gpu": {"block_q": 32, "num_warps": 2}, "tpu": TpuBlocks(block_k=256)})
    assert kb.resolve("gpu", 64) == GpuBlocks(block_q=32, block_k=64, num_warps=2, num_stages=3)
    assert kb.resolve("tpu", 64).block_k == 256
    assert kernel_blocks(GpuBlocks(block_k=128)).resolve("gpu", 128).block_k == 128
    assert kernel_blocks(None) is None and kernel_blocks(kb) is kb
    hash(kb)
    with pytest.raises(ValueError, match="unknown platform 'cuda'; valid: 'gpu', 'tpu'"):
        kernel_blocks({"cuda": {}})
    with pytest.raises(ValueError, match="kernel_blocks\\['gpu'\\] has unknown field 'bq'"):
        kernel_blocks({"gpu": {"bq": 64}})
    with pytest.raises(ValueError, match="block_q=100"):
        kernel_blocks({"tpu": {"block_q": 100}})
    with pytest.raises(TypeError, match="kernel_blocks must be None, a dict"):
        kernel_blocks(64)


def test_config_validates_and_stores_kernel_blocks():
    kw = dict(vocab_size=8, num_layers=1, embed_dim=32, num_heads=2, mlp_dim=32,
              attention="pallas")
    cfg = TransformerConfig(**kw, kernel_blocks={"gpu": {"block_k": 32}})
    assert cfg.kernel_blocks == KernelBlocks(gpu=(("block_k", 32),))
    hash(cfg)
    assert TransformerConfig(**kw).kernel_blocks is None
    with pytest.raises(ValueError, match="GpuBlocks.block_k must be a power of two.*block_k=40"):
        TransformerConfig(**kw, kernel_blocks={"gpu": {"block_k": 40}})


def _lowered(platform, blocks, length=512, d=64):
    enc = posenc_jax.get("alibi", num_heads=4)
    q = jax.ShapeDtypeStruct((1, length, 4, d), jnp.bfloat16)
    pos = jnp.arange(length, dtype=jnp.int32)[None]

    def f(q, k, v):
        out, vjp = jax.vjp(lambda *a: flash_attention(
            *a, encoding=enc, params={}, q_positions=pos, k_positions=pos, causal=True,
            blocks=blocks), q, k, v)
        return vjp(out)

    return jax.jit(f).trace(q, q, q).lower(lowering_platforms=(platform,)).as_text()


def test_the_lowered_triton_kernels_take_each_pass_blocks_and_warps():
    """L=512: forward block_q 32 -> grid 16, dq block_q 16 -> 32, dk/dv block_k 128 -> 4."""
    text = _lowered("cuda", {"gpu": {"block_q": 32, "block_q_dq": 16, "block_k_dkv": 128,
                                     "num_warps": 2}})
    assert re.findall(r"grid_z = (\d+)", text) == ["16", "32", "4"]
    assert set(re.findall(r"num_warps = (\d+)", text)) == {"2"}


def test_the_lowered_mosaic_kernels_take_each_pass_blocks():
    """L=512, the SMEM visibility rows [B * n, 1, m]: forward 256 x 128 -> 2 x 4; dq the
    default 128 x 128 -> 4 x 4; dk/dv 64 x 512 -> (per key block) 1 x 8."""
    text = _lowered("tpu", {"tpu": {"block_q": 256, "block_q_dkv": 64, "block_k_dkv": 512}})
    for rows in ("2x1x4xi32", "4x1x4xi32", "1x1x8xi32"):
        assert f"tensor<{rows}>" in text

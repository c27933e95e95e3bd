"""attention="pallas" in the model: lowering at L=4096 for cuda and tpu on this CPU host
contains the kernel's custom call and no [.., 4096, 4096] tensor (forward and backward),
dense has many, blockwise none; cuDNN without a bias keeps RoPE free of [L, L] too; and a
KV-cache decode with the kernel (raw keys cached, rotated in-kernel) equals the full forward.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from kernel_helpers import numpy_model

from posenc_jax.model.transformer import Transformer, TransformerConfig, init_cache

L = 4096
KERNEL_CALL = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


def lowered(attention, encoding, platform, length=L):
    """Text of the lowered train-step gradient (abstract model: nothing is allocated)."""
    cfg = TransformerConfig(vocab_size=64, num_layers=1, embed_dim=64, num_heads=4,
                            num_kv_heads=2, mlp_dim=64, encoding=encoding, dtype="bfloat16",
                            attention=attention)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))

    def loss(state, tokens):
        return jnp.mean(nnx.merge(graphdef, state)(tokens).astype(jnp.float32))

    tokens = jax.ShapeDtypeStruct((1, length), jnp.int32)
    return jax.jit(jax.value_and_grad(loss)).trace(state, tokens).lower(
        lowering_platforms=(platform,)).as_text()


def square_tensors(text: str, length: int = L) -> int:
    return len(re.findall(rf"(?<![0-9]){length}x{length}x", text))


@pytest.mark.parametrize(("encoding", "platform"),
                         [("rope", "cuda"), ("alibi", "cuda"), ("rope", "tpu"), ("t5", "tpu")])
def test_kernel_lowering_has_its_custom_call_and_no_square_tensor(platform, encoding):
    text = lowered("pallas", encoding, platform)
    assert KERNEL_CALL[platform] in text
    for kernel in ("fwd", "dq", "dkv"):
        assert f"posenc_flash_{kernel}_kernel" in text
    assert square_tensors(text) == 0


def test_auto_is_the_kernel_on_gpu_and_dense_on_cpu():
    assert KERNEL_CALL["cuda"] in lowered("auto", "rope", "cuda")
    cpu = lowered("auto", "rope", "cpu", length=64)
    assert "posenc_flash" not in cpu and square_tensors(cpu, 64) > 0      # dense on CPU


def test_dense_materialises_square_tensors_and_blockwise_does_not():
    assert square_tensors(lowered("dense", "alibi", "cuda")) > 10
    assert square_tensors(lowered("blockwise", "alibi", "cuda")) == 0


def test_cudnn_rope_uses_the_fused_causal_kernel_without_a_square_bias(monkeypatch):
    """Cross-lowering cuDNN attention needs jax to believe cuDNN 9.10 on sm_90 is present:
    its version probes are patched (private jax API, test only; nothing runs)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fa, "check_compute_capability", lambda capability: True)
    monkeypatch.setattr(fa, "is_cuda_compute_capability_equal", lambda capability: False)
    text = lowered("cudnn", "rope", "cuda")
    assert "__cudnn$fmhaSoftmax" in text and square_tensors(text) == 0
    assert square_tensors(lowered("cudnn", "alibi", "cuda")) > 0


def test_decode_with_the_kernel_equals_the_full_forward():
    """Prefill 14 tokens, decode the 15th: the config and shapes of test_kernel_faults.py's
    decode across a block boundary, so in one run the persistent cache compiles them once."""
    cfg = TransformerConfig(vocab_size=32, num_layers=1, embed_dim=32, num_heads=4,
                            num_kv_heads=2, mlp_dim=32, encoding="rope", attention="pallas",
                            block_size=16)
    model = numpy_model(cfg)  # NumPy-drawn parameters: no sampler compiled per shape
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (2, 19)), jnp.int32)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)
    step = nnx.jit(lambda m, t, c: m(t, cache=c))
    cache = init_cache(model, 2, 32)
    first, cache = step(model, tokens[:, :14], cache)
    last, cache = step(model, tokens[:, 14:15], cache)
    np.testing.assert_allclose(jnp.concatenate([first, last], 1), full[:, :15], atol=2e-5)


def test_device_benchmark_entry_point_records_each_cell_and_its_failure():
    """benchmarks/attention_device.run (called by scripts/device_check.sh): a dict of rows; a
    cell that cannot run here (cuDNN on CPU) records its error, the others their figures."""
    from benchmarks import attention_device

    cells = (("cudnn", "rope", "cudnn"), ("xla", "alibi", "dense"))
    result = attention_device.run(smoke=True, lengths=(32,), cells=cells, log=lambda _: None)
    failed, ran = result["rows"]
    assert failed["error"] and failed["fwd_ms"] is None
    assert ran["error"] is None and ran["fwd_ms"] > 0 and ran["fwd_bwd_mem_bytes"] > 0

"""Pallas flash-attention kernels (GPU: Triton, TPU: Mosaic, CPU: interpret) that compute
the positional bias and apply RoPE inside the kernel; see `flash.flash_attention`."""

from posenc_jax.model.kernels.flash import check_supported, flash_attention

__all__ = ["check_supported", "flash_attention"]

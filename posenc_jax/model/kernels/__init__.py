"""Pallas flash-attention kernels (GPU: Triton, TPU: Mosaic, CPU: interpret) that compute
the positional bias and apply RoPE inside the kernel; see `flash.flash_attention`. Block sizes:
`blocks` (`GpuBlocks`, `TpuBlocks`, `KernelBlocks`, `kernel_blocks`); what lowers where:
`support.unsupported_reason`."""

from posenc_jax.model.kernels.blocks import GpuBlocks, KernelBlocks, TpuBlocks, kernel_blocks
from posenc_jax.model.kernels.flash import check_supported, flash_attention
from posenc_jax.model.kernels.support import unsupported_reason

__all__ = ["GpuBlocks", "KernelBlocks", "TpuBlocks", "check_supported", "flash_attention",
           "kernel_blocks", "unsupported_reason"]

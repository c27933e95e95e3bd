"""`flash_attention`: the Pallas kernel behind `attend(..., implementation="pallas")`.

Same contract as `posenc_jax.model.attention.attend` (masks from explicit positions, segment
ids and a key mask; rows that see no key give zeros), with positions entering only inside
the kernel, from each block's own positions:

* the bias from `encoding.elementwise_bias` (ALiBi slopes, T5 buckets and table, any scheme
  that declares one) -- never an [L, L] tensor, forward or backward; params gradients are
  accumulated per (batch, head, query block) in the kernel and summed here;
* the rotation from `encoding.kernel_rotation` when given (RoPE): q and k arrive RAW and are
  rotated in the kernel (cos/sin in float32); their gradients are rotated back there;
* the local rules of `scores.build_mask` (a window, chunks -- chunk ids pos // c computed
  here, compared in-kernel like segment ids --, sink tokens), with whole key blocks outside
  them skipped (`vjp.visibility`);
* learned sinks: a float [H] logit per head that starts each row's online softmax
  (forward), with its gradient from (lse, delta) in the backward (`vjp.backward`).

Schemes whose bias is not elementwise (Shaw, FIRE, CoPE: content- or context-dependent) are
refused with a ValueError naming the alternatives.

Shapes: B batch, Lq / Lk lengths, H query heads, K kv heads (K divides H), D head dim.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.checks import integer_array
from posenc_jax.encodings.base import Encoding, KernelRotation
from posenc_jax.encodings.capabilities import BlockTransform, ElementwiseBias, ValueTerm
from posenc_jax.model.kernels.blocks import kernel_blocks
from posenc_jax.model.kernels.lse import core_lse
from posenc_jax.model.kernels.static import Static
from posenc_jax.model.kernels.vjp import core, padded_length
from posenc_jax.model.scores import check_local, check_sinks, encoding_bias

__all__ = ["check_heads", "check_supported", "chunk_ids", "flash_attention", "int32_positions",
           "mask_rows"]


def check_supported(encoding: Encoding) -> None:
    """ValueError unless the kernel can compute this encoding's bias in-kernel (and the
    encoding declares no hook the kernel lacks: a value term or a block transform)."""
    if isinstance(encoding, (ValueTerm, BlockTransform)):
        raise ValueError(  # noqa: TRY004  (a capability the kernel lacks, not a wrong type)
            f"encoding {encoding.name!r} declares a value_term or a block_transform, which the "
            "Pallas kernel does not apply; use attention='blockwise' or 'dense'")
    if "bias" in encoding.hooks and not isinstance(encoding, ElementwiseBias):
        raise ValueError(
            f"encoding {encoding.name!r} has a score bias that is not an elementwise function "
            "of (query position, key position, head), so the Pallas kernel cannot compute it "
            "in-kernel; use attention='blockwise' or 'dense'")


def check_heads(encoding: Encoding, params: Any, num_heads: int) -> None:
    """ValueError unless the encoding's bias has `num_heads` heads -- the check dense and
    blockwise attention make (`scores.encoding_bias`), on abstract 1 x 1 positions."""
    pos = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    jax.eval_shape(lambda p, qp, kp: encoding_bias(encoding, p, qp, kp, None, num_heads),
                   params, pos, pos)


def int32_positions(q_positions, k_positions):
    """The positions as the kernel's int32. 64-bit positions (under `jax_enable_x64`) that
    leave the int32 range are first rebased per batch row by the row's smallest position
    (q and k together): q - k is then exact, as in dense attention, where a cast would wrap.

    Raises:
      ValueError: concrete 64-bit positions whose batch row spans more than the int32 range
        (names the row and its smallest and largest position). Traced ones saturate at the
        int32 limit instead: a far key stays far, never wraps to a near one.
    """
    qp, kp = jnp.asarray(q_positions), jnp.asarray(k_positions)
    if qp.dtype.itemsize <= 4 and kp.dtype.itemsize <= 4:
        return qp.astype(jnp.int32), kp.astype(jnp.int32)
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    qp, kp = qp.astype(jnp.int64), kp.astype(jnp.int64)
    row_min = jnp.minimum(jnp.min(qp, axis=1, keepdims=True), jnp.min(kp, axis=1, keepdims=True))
    row_max = jnp.maximum(jnp.max(qp, axis=1, keepdims=True), jnp.max(kp, axis=1, keepdims=True))
    if not isinstance(row_min, jax.core.Tracer):
        span = np.asarray(row_max - row_min)[:, 0]
        if np.any(span > hi):
            r = int(np.argmax(span))
            raise ValueError(
                f"q_positions and k_positions span [{int(row_min[r, 0])}, {int(row_max[r, 0])}] "
                f"in batch row {r}, more than the Pallas kernel's int32 positions hold (a row's "
                f"positions at most {hi} apart); use attention='dense' or 'blockwise'")
    outside = jnp.any((row_min < lo) | (row_max > hi))
    base = jnp.where(outside, row_min, 0)
    return (jnp.clip(qp - base, lo, hi).astype(jnp.int32),
            jnp.clip(kp - base, lo, hi).astype(jnp.int32))


def _pad(x, axis: int, size: int, value=0):
    """`x` padded along `axis` to `size` with `value`, or with its last entry (value=None)."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    if value is None:
        return jnp.pad(x, widths, mode="edge")
    return jnp.pad(x, widths, constant_values=value)


def chunk_ids(q_positions, k_positions, chunk_size: int):
    """int32 (q ids [B|1, Lq], k ids [B|1, Lk]): floor(position / chunk_size), from the
    caller's positions (before any int32 rebasing, which would move chunk edges); 64-bit ids
    are rebased per row by the row's smallest id first (only equality is compared)."""
    qc = jnp.floor_divide(jnp.asarray(q_positions), chunk_size)
    kc = jnp.floor_divide(jnp.asarray(k_positions), chunk_size)
    if qc.dtype.itemsize > 4 or kc.dtype.itemsize > 4:
        base = jnp.minimum(jnp.min(qc, axis=1, keepdims=True), jnp.min(kc, axis=1, keepdims=True))
        qc, kc = qc - base, kc - base
    return qc.astype(jnp.int32), kc.astype(jnp.int32)


def _feature_order(d: int, r: int, layout: str) -> np.ndarray | None:
    """Static permutation taking an interleaved layout to the half layout (None: identity)."""
    if not r or layout == "half":
        return None
    return np.concatenate([np.arange(0, 2 * r, 2), np.arange(1, 2 * r, 2),
                           np.arange(2 * r, d)])


def mask_rows(q_positions, k_positions, q_segment_ids, k_segment_ids, k_mask, chunks, *,
              batch: int, q_len: int, k_len: int) -> dict:
    """The kernel's mask inputs, padded to the padded lengths: query rows int32 [B, Lq', 1]
    (qpos, qseg, qchunk: padded with the last row's values, so a padded row widens no block's
    range) and key rows int32 [B, 1, Lk'] (kpos, kvalid, kseg, kchunk: padded keys invalid).
    `chunks`: (q ids, k ids) of `chunk_ids` or None. What `vjp.visibility` reads too."""

    def rows(x, n, pad):                                                   # -> [B, n, 1]
        return _pad(jnp.broadcast_to(jnp.asarray(x, jnp.int32), (batch, x.shape[1])), 1, n,
                    pad)[:, :, None]

    def cols(x, n):                                                        # -> [B, 1, n]
        return jnp.swapaxes(rows(x, n, 0), 1, 2)

    lk = k_positions.shape[1]
    valid = jnp.ones((1, lk), bool) if k_mask is None else k_mask.astype(bool)
    aux = {"qpos": rows(q_positions, q_len, None), "kpos": cols(k_positions, k_len),
           "kvalid": cols(valid.astype(jnp.int32), k_len)}
    if q_segment_ids is not None:
        aux["qseg"], aux["kseg"] = rows(q_segment_ids, q_len, None), cols(k_segment_ids, k_len)
    if chunks is not None:
        aux["qchunk"], aux["kchunk"] = rows(chunks[0], q_len, None), cols(chunks[1], k_len)
    return aux


def flash_attention(q, k, v, *, encoding: Encoding, params: Any, q_positions, k_positions,
                    causal: bool, q_segment_ids=None, k_segment_ids=None, k_mask=None,
                    rotation: KernelRotation | None = None, block_q: int = 32,
                    block_k: int = 32, cpu_kernel: str = "gpu",
                    blocks: Any = None, interpret: Any = None,
                    window: int | None = None, chunk_size: int | None = None,
                    sink_tokens: int = 0, sinks: Any = None, return_lse: bool = False) -> Any:
    """Flash attention with the encoding's positions applied in-kernel.

    Args:
      q: [B, Lq, H, D]; k, v: [B, Lk, K, D] (raw when `rotation` is given, else as the
        caller's rotate hook left them).
      q_positions, q_segment_ids: int [B|1, Lq]; k_positions, k_segment_ids, k_mask:
        [B|1, Lk] (validated by `attend`); segment ids both or neither.
      rotation: the encoding's `kernel_rotation` (None: no in-kernel rotation).
      block_q, block_k: blocks of CPU interpret mode (powers of two; GPU and TPU use
        `blocks`).
      cpu_kernel: "gpu" or "tpu": which kernel structure interpret mode runs on CPU.
      blocks: the GPU / TPU block sizes per pass (`blocks.kernel_blocks` takes None -- the
        defaults by head dim --, a dict keyed by "gpu" / "tpu", or a `KernelBlocks`).
      interpret: what CPU interpret mode passes as `pallas_call(interpret=...)` (None:
        True), e.g. `pltpu.InterpretParams(out_of_bounds_reads="raise")`, the bounds checker.
      window: sliding-window attention: a key at kp is visible to a query at qp only if
        qp - kp < window (with the causal rule, segments and the key mask); None: no limit.
        Key blocks wholly outside every query's window are skipped (never loaded).
      chunk_size: chunked attention: visible only if kp // chunk_size == qp // chunk_size;
        blocks of other chunks are skipped. None: no chunks.
      sink_tokens: keys with kp < sink_tokens are exempt from the window and the chunk.
      sinks: float [H] learned sink logits (one more logit in every row's denominator, with
        a zero value; gradient included) or None.
      return_lse: also return each row's log-sum-exp, differentiable (`lse.core_lse`).

    Returns:
      [B, Lq, H, D] in q.dtype; with `return_lse`, (out float32 [B, Lq, H, D] (rounded to
      q.dtype by the kernel), lse float32 [B, Lq, H]), the convention of
      `blockwise.attend_blockwise_lse` (lse = -1e30 and out = 0 for a row that sees no key;
      with sinks lse includes the sink).
    """
    check_supported(encoding)
    window, chunk_size, sink_tokens = check_local(window=window, chunk_size=chunk_size,
                                                  sink_tokens=sink_tokens)
    sinks = check_sinks(sinks, q.shape[2])
    integer_array("q_positions", q_positions)  # positions index blocks and tables here
    integer_array("k_positions", k_positions)
    b, lq, h, d = q.shape
    lk, kh = k.shape[1], k.shape[2]
    if isinstance(encoding, ElementwiseBias):
        check_heads(encoding, params, h)
    if b == 0 or lq == 0 or lk == 0:  # as dense: no rows, or rows that see no key -> zeros
        if return_lse:
            lse = (jnp.full(q.shape[:3], -1e30, jnp.float32) if sinks is None else
                   jnp.broadcast_to(sinks.astype(jnp.float32), q.shape[:3]))
            return jnp.zeros(q.shape, jnp.float32), lse
        return jnp.zeros(q.shape, q.dtype)
    chunks = None if chunk_size is None else chunk_ids(q_positions, k_positions, chunk_size)
    q_positions, k_positions = int32_positions(q_positions, k_positions)
    r = 0 if rotation is None else int(jnp.shape(rotation.inv_freq)[0])
    order = _feature_order(d, r, None if rotation is None else rotation.layout)
    if order is not None:
        q, k = q[..., order], k[..., order]
    lqp, _ = padded_length(lq)
    lkp, _ = padded_length(lk)
    qt = _pad(jnp.transpose(q, (0, 2, 1, 3)), 2, lqp)                      # [B, H, Lq, D]
    kt = _pad(jnp.transpose(k, (0, 2, 1, 3)), 2, lkp)
    vt = _pad(jnp.transpose(v, (0, 2, 1, 3)), 2, lkp)

    aux = mask_rows(q_positions, k_positions, q_segment_ids, k_segment_ids, k_mask, chunks,
                    batch=b, q_len=lqp, k_len=lkp)
    segments = q_segment_ids is not None
    if sinks is not None:
        aux["sink"] = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, None, None],
                                       (b, h, lqp, 1))
    if r:
        inv = jnp.asarray(rotation.inv_freq, jnp.float32)
        factor = jnp.asarray(rotation.attention_factor, jnp.float32)
        aux["rot"] = jnp.stack([inv, jnp.broadcast_to(factor, inv.shape)])   # [2, R]
    leaves, tree = jax.tree.flatten(params if isinstance(encoding, ElementwiseBias) else {})
    st = Static(causal=bool(causal), segments=segments, scale=1.0 / math.sqrt(d),
                num_heads=h, groups=h // kh, head_dim=d, rotary=r,
                encoding=encoding if isinstance(encoding, ElementwiseBias) else None,
                param_tree=tree, block_q=min(block_q, padded_length(lq)[1]),
                block_k=min(block_k, padded_length(lk)[1]), cpu_kernel=cpu_kernel,
                blocks=kernel_blocks(blocks), interpret=interpret,
                window=window, chunks=chunks is not None, sink_tokens=sink_tokens,
                sinks=sinks is not None, q_len=lq)
    if return_lse:
        o, lse = core_lse(st, qt, kt, vt, aux, [jnp.asarray(x) for x in leaves])
        return (jnp.transpose(o[:, :, :lq], (0, 2, 1, 3)).astype(jnp.float32),
                jnp.transpose(lse[:, :, :lq, 0], (0, 2, 1)))
    out = core(st, qt, kt, vt, aux, [jnp.asarray(x) for x in leaves])
    return jnp.transpose(out[:, :, :lq], (0, 2, 1, 3))           # v's features: no undo

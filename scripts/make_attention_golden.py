"""Goldens for learned sinks and chunked attention from transformers' own attention functions.

Run in a throwaway venv with torch and transformers (never imported by the package or tests):

    /work/goldenvenv/bin/python scripts/make_attention_golden.py

It writes tests/data/attention_golden.npz: for each case, the inputs (q [B, H, L, D] etc. as
transformers lays them out), the output and the float64 gradients of sum(out * cot) w.r.t.
q, k, v (and the sinks), cot zero on left-padded query rows (transformers gives them a
uniform average where every key is masked, we give zeros: only real rows are compared). The masks come from transformers' mask functions
(`masking_utils.sliding_window_overlay`, `chunked_overlay`, `causal_mask_function`,
`padding_mask_function`) evaluated on index grids, as `create_causal_mask` does:
  gpt_oss_window: `models/gpt_oss/modeling_gpt_oss.eager_attention_forward` (sinks joined
    to every softmax denominator), sliding window 6, GQA 4 over 2, row 1 left-padded by 3
    (its padded queries see no key: all their mass on the sink);
  gpt_oss_full: the same attention without the window (gpt-oss's full layers);
  llama4_chunked: `models/llama4/modeling_llama4.eager_attention_forward` with
    `chunked_causal_mask_function(8, left_padding)`, row 1 left-padded by 2.
Positions for our side: index - left_padding; key mask: index >= left_padding.
"""

from __future__ import annotations

import pathlib
import types

import numpy as np
import torch
import transformers
from transformers import masking_utils as mu
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama4 import modeling_llama4

B, H, K, L, D = 2, 4, 2, 21, 8
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "attention_golden.npz"


def mask(fn_and, left_padding):
    """Additive float64 mask [B, 1, L, L] (0 visible, finfo.min hidden) of a mask function."""
    idx = torch.arange(L)
    pad = idx[None, :] >= left_padding[:, None]                                  # [B, L]
    fn = mu.and_masks(fn_and, mu.padding_mask_function(pad))
    visible = torch.stack([torch.stack([torch.stack([fn(b, 0, q, k) for k in idx])
                                        for q in idx]) for b in range(B)])[:, None]
    zero = torch.zeros(visible.shape, dtype=torch.float64)
    return torch.where(visible, zero, torch.finfo(torch.float64).min), visible


def case(name, forward, fn_and, left_padding, sinks, seed, out):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, K, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, K, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    cot = torch.randn(B, L, H, D, generator=g, dtype=torch.float64)
    cot = cot * (torch.arange(L)[None, :] >= left_padding[:, None])[:, :, None, None]
    module = types.SimpleNamespace(num_key_value_groups=H // K, training=False)
    leaves = [q, k, v]
    if sinks is not None:
        module.sinks = torch.tensor(sinks, dtype=torch.float64, requires_grad=True)
        leaves.append(module.sinks)
    additive, visible = mask(fn_and, left_padding)
    o, _ = forward(module, q, k, v, additive, scaling=D ** -0.5)                  # [B, L, H, D]
    grads = torch.autograd.grad((o * cot).sum(), leaves)
    lp = left_padding.numpy()
    out.update({f"{name}/q": q.detach().numpy(), f"{name}/k": k.detach().numpy(),
                f"{name}/v": v.detach().numpy(), f"{name}/cot": cot.numpy(),
                f"{name}/out": o.detach().numpy(), f"{name}/visible": visible.numpy(),
                f"{name}/positions": np.arange(L)[None, :] - lp[:, None],
                f"{name}/k_mask": np.arange(L)[None, :] >= lp[:, None]})
    for n, gr in zip(("dq", "dk", "dv", "dsinks"), grads):
        out[f"{name}/{n}"] = gr.numpy()
    if sinks is not None:
        out[f"{name}/sinks"] = np.asarray(sinks)


def main() -> None:
    out: dict = {}
    sinks = [0.5, -1.0, 2.5, 0.0]
    gpt = modeling_gpt_oss.eager_attention_forward
    case("gpt_oss_window", gpt,
         mu.and_masks(mu.sliding_window_overlay(6), mu.causal_mask_function),
         torch.tensor([0, 3]), sinks, 0, out)
    case("gpt_oss_full", gpt, mu.causal_mask_function, torch.tensor([0, 3]), sinks, 1, out)
    case("llama4_chunked", modeling_llama4.eager_attention_forward,
         mu.chunked_causal_mask_function(8, torch.tensor([0, 2])), torch.tensor([0, 2]), None,
         2, out)
    out["versions"] = np.asarray([torch.__version__, transformers.__version__])
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({len(out)} arrays; torch {torch.__version__}, transformers "
          f"{transformers.__version__})")


if __name__ == "__main__":
    main()

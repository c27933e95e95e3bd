"""The decoder LM that a PyTorch user would write, for `benchmarks/vs_pytorch.py` only.

Same architecture and update as `posenc_jax.model.transformer.Transformer` + `train.step`:
token embedding scaled by sqrt(E), pre-norm blocks (RMSNorm -> q/k/v projections, RoPE
("half" layout, base 10000) on q and k, causal `scaled_dot_product_attention`, output
projection; RMSNorm -> SwiGLU), final RMSNorm, logits from the tied embedding's transpose;
mean next-token cross-entropy; global-norm clipping at 1.0; AdamW (b1 0.9, b2 0.95,
eps 1e-8, weight decay 0.1 on matrices only). Plain PyTorch eager, float32: what we compare
against, not what we ship (PyTorch is never a dependency of the package, its tests or CI).

Shapes: B batch, L length, E embed dim, H heads, D head dim, F MLP width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, e: int, h: int, f: int):
        super().__init__()
        self.h, self.d = h, e // h
        self.attn_norm = nn.RMSNorm(e, eps=1e-6)
        self.qkv = nn.Linear(e, 3 * e, bias=False)
        self.o = nn.Linear(e, e, bias=False)
        self.mlp_norm = nn.RMSNorm(e, eps=1e-6)
        self.gate_up = nn.Linear(e, 2 * f, bias=False)
        self.down = nn.Linear(f, e, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.h, self.d).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))                 # [B, H, L, D]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, e))
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, D] rotated, half layout (Hugging Face's `rotate_half`); cos/sin [L, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class TwinLM(nn.Module):
    def __init__(self, *, vocab: int, layers: int, embed: int, heads: int, mlp: int,
                 seq_len: int):
        super().__init__()
        self.embed_dim = embed
        self.embedding = nn.Embedding(vocab, embed)
        nn.init.normal_(self.embedding.weight, std=1 / math.sqrt(embed))
        self.blocks = nn.ModuleList(Block(embed, heads, mlp) for _ in range(layers))
        self.final_norm = nn.RMSNorm(embed, eps=1e-6)
        d = embed // heads
        inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)   # [L, D/2]
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) * math.sqrt(self.embed_dim)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.final_norm(x) @ self.embedding.weight.T                # [B, L, V]


class TwinTrainer:
    """`step()` runs one update on a fixed batch; `sync()` returns the last loss (a float)."""

    def __init__(self, *, vocab: int, layers: int, embed: int, heads: int, mlp: int,
                 batch: int, seq_len: int, seed: int = 0):
        torch.manual_seed(seed)
        self.model = TwinLM(vocab=vocab, layers=layers, embed=embed, heads=heads, mlp=mlp,
                            seq_len=seq_len)
        params = list(self.model.parameters())
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
        gen = torch.Generator().manual_seed(seed)
        data = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)
        self.inputs, self.targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        self.loss = None

    def step(self) -> None:
        logits = self.model(self.inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.loss = loss.detach()

    def sync(self) -> float:
        return float(self.loss)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

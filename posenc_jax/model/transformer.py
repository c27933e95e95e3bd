"""A decoder-only language model in Flax NNX with a pluggable positional encoding.

    model = Transformer(TransformerConfig(vocab_size=256, num_layers=4, embed_dim=256,
                                          num_heads=8, mlp_dim=1024, encoding="alibi"),
                        rngs=nnx.Rngs(0))
    logits = model(tokens)                          # tokens int [B, L] -> float32 [B, L, V]
    logits = model(tokens, positions, segment_ids=segment_ids)      # packed documents
    logits, cache = model(tokens, positions, cache=cache)           # KV-cache prefill / decode

Pre-norm blocks (RMSNorm -> attention -> residual, RMSNorm -> SwiGLU or GELU MLP ->
residual), optional grouped-query attention, tied or untied embeddings. Positions enter only
through the three hooks of `posenc_jax.encodings.base`: `embed` once at the input, `rotate` on q/k
and `bias` on the scores in every layer (each layer has its own encoding and params, e.g. its
own T5 or Shaw table). Positions default to `arange(L)`; pass them explicitly for packing,
offsets or decoding. See `posenc_jax.model.config` for the config and `posenc_jax.model.kv_cache` for the
cache (`init_cache`) and its regime policy under length-dependent RoPE scaling.

Embedding scale: token embeddings are drawn from N(0, 1/E) and multiplied by sqrt(E) at the
input (Vaswani et al.; Gemma; `embed_scale=None` for pretrained Llama-like models), so their entries have unit variance -- the same magnitude as a
sinusoidal PE (entries in [-1, 1]) or a learned PE (initialised with stddev 1 here); the tied
output projection then starts with unit-variance logits.

Sharding (logical axis names). Every parameter carries logical axis names in its
`out_sharding` metadata, and the main activations are constrained with
`flax.linen.with_logical_constraint`; without rules and a mesh both are no-ops. Names:

    batch, length          activations only
    embed (E), vocab (V), heads (H), kv_heads (K), kv (D, the head dim), mlp (F)
    table                  rows of an encoding's table (learned PE, T5 buckets, Shaw)
    expert                 a MoE layer's experts (X; `posenc_jax.model.moe`)

`LOGICAL_AXES` lists them; a rule set must map every name (to a mesh axis or None);
`complete_rules(rules)` adds `(name, None)` for those a rule set leaves out. A trainer:

    rules = complete_rules((("batch", ("data", "fsdp")), ("embed", "fsdp"),
                            ("heads", "tensor"), ("mlp", "tensor"), ("vocab", "tensor")))
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        model = Transformer(config, rngs=nnx.Rngs(0))      # params created already sharded
        state = nnx.state(model, nnx.Param)
        pspecs = nnx.get_partition_spec(state)             # mesh PartitionSpecs, by the rules
        shardings = nnx.get_named_sharding(state, mesh)    # for jit in/out_shardings
        # ... and trace/run the jitted train step inside the same `with` (the activation
        # constraints read the rules and the mesh at trace time).

Params are sharded at creation only when a mesh and rules are both set (otherwise they are
plain arrays and `nnx.get_partition_spec` under the rules still gives the specs; e.g.
`nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))` for an abstract model).
Without rules, `nnx.get_partition_spec` returns the logical names themselves. The mesh axes
must be Auto (`jax.make_mesh` defaults to Explicit in this JAX version).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from posenc_jax.checks import token_ids
from posenc_jax.encodings import capabilities
from posenc_jax.encodings.base import Encoding
from posenc_jax.model import context_parallel, features, kv_cache, rotation, scan
from posenc_jax.model.attention import as_2d, attend
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.generate import generate
from posenc_jax.model.kv_cache import KVCache, init_cache
from posenc_jax.model.layer_pattern import LayerSpec
from posenc_jax.model.mlp import MLP
from posenc_jax.model.moe import MoE
from posenc_jax.model.norms import RMSNorm
from posenc_jax.model.params import normal as _normal
from posenc_jax.model.params import param as _param
from posenc_jax.model.qkv import add_qkv_features, apply_qkv_features
from posenc_jax.model.remat import tag_attention
from posenc_jax.model.scores import split_positions

__all__ = [
    "LOGICAL_AXES",
    "KVCache",
    "Transformer",
    "TransformerConfig",
    "complete_rules",
    "generate",
    "init_cache",
]

Array = jax.Array
LOGICAL_AXES = ("batch", "length", "embed", "vocab", "heads", "kv_heads", "kv", "mlp", "table",
                "expert")


def complete_rules(rules) -> tuple:
    """`rules` plus `(name, None)` for every name of `LOGICAL_AXES` it does not map."""
    rules = tuple((str(a), b) for a, b in rules)
    mapped = {a for a, _ in rules}
    return rules + tuple((a, None) for a in LOGICAL_AXES if a not in mapped)


def constrain(x: Array, names: tuple) -> Array:
    """Logical sharding constraint (no-op without logical axis rules and a mesh)."""
    return nn.with_logical_constraint(x, names)


def encoding_params(encoding: Encoding, key: Array, param_dtype, *, hooks: tuple[str, ...]
                    ) -> nnx.Dict:
    """The encoding's params as an `nnx.Dict` of `nnx.Param`s, sharded by the logical axes the
    encoding declares (`capabilities.ParamAxes`); empty unless one of `hooks` ("embed",
    "rotate", "bias") is in the encoding's declared `hooks` (every capability refines one of
    them), so no module carries a table that it never reads."""
    if not set(hooks) & encoding.hooks:
        return nnx.Dict({})
    out = {}
    axes = capabilities.param_axes(encoding)
    for name, value in encoding.init(key).items():
        names = axes.get(name, (None,) * jnp.ndim(value))
        if len(names) != jnp.ndim(value):
            raise ValueError(f"encoding {encoding.name!r} declares param_axes[{name!r}]={names} "
                             f"for a param of shape {jnp.shape(value)}")
        out[name] = _param(jnp.asarray(value), names, param_dtype)
    return nnx.Dict(out)


def _values(params: nnx.Dict) -> dict[str, Array]:
    """The raw arrays of an encoding's params (kept in param_dtype; the hooks upcast)."""
    return {k: v[...] for k, v in params.items()}


class Attention(nnx.Module):
    """Self-attention that calls its encoding's rotate and bias hooks; caches rotated keys.
    `spec`: the layer's settings (`config.layer(i)`: encoding, window, chunk, QK L2-norm,
    temperature); with `config.attention_sinks`, a learned sink logit per head (`sinks` [H])."""

    def __init__(self, config: TransformerConfig, spec: LayerSpec, *, rngs: nnx.Rngs):
        e, h, kh, d = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
        pd = config.param_dtype
        encoding = config.encoding_for(spec)
        self.config, self.spec, self.encoding, self.window = config, spec, encoding, spec.window
        self.q_proj = _param(_normal(rngs.params(), (e, h, d), e), ("embed", "heads", "kv"),
                             pd)
        self.k_proj = _param(_normal(rngs.params(), (e, kh, d), e),
                             ("embed", "kv_heads", "kv"), pd)
        self.v_proj = _param(_normal(rngs.params(), (e, kh, d), e),
                             ("embed", "kv_heads", "kv"), pd)
        self.o_proj = _param(_normal(rngs.params(), (h, d, e), h * d),
                             ("heads", "kv", "embed"), pd)
        self.pe = encoding_params(encoding, rngs.params(), pd,
                                  hooks=("rotate", "bias"))
        add_qkv_features(self, config)  # bias, QK-norm (posenc_jax.model.qkv)
        if config.attention_sinks:
            self.sinks = _param(jnp.zeros((h,)), ("heads",), pd)

    def __call__(self, x: Array, positions: Array, segment_ids: Array | None,
                 memory: kv_cache.Memory | None, layer: int,
                 rotary_positions: Array | None = None) -> tuple[Array, Any]:
        """x [B, T, E], positions [B|1, T] (masks), rotary_positions [A, B|1, T] or None (the
        positions themselves) -> ([B, T, E], (k, v) buffers or None)."""
        cfg, dt = self.config, self.config.dtype
        pe = _values(self.pe)
        q = jnp.einsum("bte,ehd->bthd", x, self.q_proj[...].astype(dt))
        k = jnp.einsum("bte,ekd->btkd", x, self.k_proj[...].astype(dt))
        v = jnp.einsum("bte,ekd->btkd", x, self.v_proj[...].astype(dt))
        q, k, v = apply_qkv_features(self, q, k, v, spec=self.spec, positions=positions)
        q = constrain(q, ("batch", "length", "heads", "kv"))
        k = constrain(k, ("batch", "length", "kv_heads", "kv"))
        v = constrain(v, ("batch", "length", "kv_heads", "kv"))
        rotary = positions if rotary_positions is None else rotary_positions
        seq_positions = rotary if memory is None else memory.seq_positions
        # A mesh splitting "length" (context parallelism): the ring / all-gather over it.
        context = context_parallel.current_context_axis() if memory is None else None
        raw = rotation.rotates_inside(self.encoding, cfg.attention) and context is None
        if not raw:
            q, k = rotation.rotate_new(self.encoding, pe, q, k, rotary, seq_positions)
        if memory is None:
            k_all, v_all, new = k, v, None
            kp, ks, km = positions, segment_ids, None
        else:
            k_all, v_all = memory.write(layer, k, v)
            new = (k_all, v_all)
            k_all, v_all = k_all.astype(dt), v_all.astype(dt)  # a cache may store another dtype
            kp, ks, km = memory.positions, memory.segment_ids, memory.valid
        masks = cfg.attention_masks(  # chunk, sinks, sink tokens: only where the layer has them
            self.spec, sinks=self.sinks[...].astype(jnp.float32) if cfg.attention_sinks else None)
        if context is not None:
            out = context_parallel.context_attention(
                q, k_all, v_all, encoding=self.encoding, params=pe, q_positions=positions,
                k_positions=kp, causal=cfg.causal, q_segment_ids=segment_ids,
                k_segment_ids=ks, mesh=context.mesh, context_axis=context.axis,
                batch_axes=context.batch_axes, mode=cfg.context_mode,
                block_q=cfg.block_size, block_k=cfg.block_size, window=self.window,
                kernel_blocks=cfg.kernel_blocks, **masks)
        else:
            out = attend(q, k_all, v_all, encoding=self.encoding, params=pe,
                         q_positions=positions, k_positions=kp, causal=cfg.causal,
                         q_segment_ids=segment_ids, k_segment_ids=ks, k_mask=km,
                         implementation=cfg.attention, block_q=cfg.block_size,
                         block_k=cfg.block_size, rotated=not raw,
                         kernel_blocks=cfg.kernel_blocks, window=self.window, **masks)
        out = tag_attention(constrain(out, ("batch", "length", "heads", "kv")))
        y = jnp.einsum("bthd,hde->bte", out, self.o_proj[...].astype(dt))
        if cfg.o_bias:
            y = y + self.o_bias[...].astype(dt)[None, None]
        return y, new


class Block(nnx.Module):
    """Pre-norm transformer block (with `post_norms`, also norms on both branch outputs); its
    MLP is the mixture of experts where `spec.moe`. Returns (x, (k, v) or None, the layer's
    load-balancing loss: float32 scalar, 0 for a dense MLP)."""

    def __init__(self, config: TransformerConfig, spec: LayerSpec, *, rngs: nnx.Rngs):
        kw = {"eps": config.norm_eps, "param_dtype": config.param_dtype,
              "offset": config.norm_offset}
        self.attn_norm = RMSNorm(config.embed_dim, **kw)
        self.attn = Attention(config, spec, rngs=rngs)
        self.mlp_norm = RMSNorm(config.embed_dim, **kw)
        self.mlp = MoE(config, rngs=rngs) if spec.moe else MLP(config, rngs=rngs)
        if config.post_norms:
            self.post_attn_norm = RMSNorm(config.embed_dim, **kw)
            self.post_mlp_norm = RMSNorm(config.embed_dim, **kw)

    def __call__(self, x, positions, segment_ids, memory, layer, rotary_positions=None):
        post = self.attn.config.post_norms
        y, new = self.attn(self.attn_norm(x), positions, segment_ids, memory, layer,
                           rotary_positions)
        y = self.post_attn_norm(y) if post else y
        x = constrain(x + y, ("batch", "length", "embed"))
        y = self.mlp(self.mlp_norm(x))
        y, aux = y if isinstance(self.mlp, MoE) else (y, jnp.zeros((), jnp.float32))
        y = self.post_mlp_norm(y) if post else y
        x = constrain(x + y, ("batch", "length", "embed"))
        return x, new, aux


class Transformer(nnx.Module):
    """Decoder-only LM; see the module docstring. `Transformer(config, *, rngs)`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        e, v, pd = config.embed_dim, config.vocab_size, config.param_dtype
        self.config = config
        self.embedding = _param(_normal(rngs.params(), (v, e), e), ("vocab", "embed"), pd)
        self.input_pe = encoding_params(config.input_encoding, rngs.params(), pd,
                                        hooks=("embed",))
        self.layers = nnx.List([Block(config, config.layer(i), rngs=rngs)
                                for i in range(config.num_layers)])
        self.final_norm = RMSNorm(e, eps=config.norm_eps, param_dtype=pd,
                                  offset=config.norm_offset)
        if not config.tie_embeddings:
            self.unembed = _param(_normal(rngs.params(), (e, v), e), ("embed", "vocab"), pd)

    def __call__(self, tokens: Array, positions: Array | None = None, *,
                 segment_ids: Array | None = None, cache: kv_cache.KVCache | None = None):
        """Logits float32 [B, L, V] for tokens int [B, L] (and the new cache if one is given).

        Args:
          tokens: int [B, L].
          positions: int [B, L] or [L]; default arange(L) (with a cache: the slots after the
            cached ones, `cache.index + arange(L)`). A model whose encoding declares
            `MultiAxisPositions` A > 1 (mrope) also takes [A, B, L]; its masks then follow the
            token order (arange(L), or the cache slots).
          segment_ids: int [B, L] or [L]: tokens attend only within their segment (packing).
          cache: a `KVCache` from `init_cache`: prefill (L > 1) and decode (L = 1) alike.

        Token ids must be in [0, V). Concrete ids outside are a ValueError naming the id;
        traced ones (under jit) cannot be checked at trace time and give NaN logits (never a
        wrapped or clamped row): check them with `posenc_jax.checks.checked_token_ids` under
        `jax.experimental.checkify.checkify`.
        """
        tokens = self._checked(tokens)
        if cache is not None:
            return kv_cache.step(self, tokens, positions, segment_ids, cache)
        if positions is None:
            positions = self._default_positions(tokens.shape[1])
        logits, _ = self.forward(tokens, positions, segment_ids, memory=None)
        return logits

    def _checked(self, tokens: Array) -> Array:
        """tokens as an int [B, L] array with concrete ids inside the vocabulary (ValueError)."""
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be an int array [B, L], got shape {tokens.shape} and "
                             f"dtype {tokens.dtype}")
        token_ids("tokens", tokens, vocab_size=self.config.vocab_size)
        return tokens

    def _default_positions(self, length: int) -> Array:
        """arange(length), refused past a learned table's max_len."""
        max_len = self.config.max_positions
        if max_len is not None and length > max_len:
            raise ValueError(f"input length L={length} exceeds the {self.config.encoding} "
                             f"encoding's max_len={max_len} positions")
        return jnp.arange(length, dtype=jnp.int32)

    def hidden_states(self, tokens: Array, positions: Array | None = None, *,
                      segment_ids: Array | None = None) -> Array:
        """The final hidden states [B, L, E] (after the final norm, in the compute dtype) for
        tokens int [B, L]: what `head` turns into logits. Positions and segment ids as in
        `__call__` (no cache). `posenc_jax.model.loss` takes these and `head` to compute a
        loss that never holds the [B, L, V] logits."""
        hidden, _ = self.hidden_states_and_aux(tokens, positions, segment_ids=segment_ids)
        return hidden

    def hidden_states_and_aux(self, tokens: Array, positions: Array | None = None, *,
                              segment_ids: Array | None = None) -> tuple[Array, Array]:
        """(`hidden_states(...)`, the load-balancing loss float32 scalar: the mean over the MoE
        layers of `posenc_jax.model.moe.load_balancing_loss`, 0 without MoE layers). The
        trainer adds `moe_aux_loss_coef` times it to the loss."""
        tokens = self._checked(tokens)
        if positions is None:
            positions = self._default_positions(tokens.shape[1])
        hidden, _, aux = self.trunk(tokens, positions, segment_ids, memory=None)
        return hidden, aux

    def head(self, hidden: Array) -> Array:
        """Logits float32 [..., V] from hidden states [..., E]: the output projection (the
        token embedding's transpose when tied, else `unembed`) and `final_logit_softcap`."""
        cfg = self.config
        out = self.embedding[...].T if cfg.tie_embeddings else self.unembed[...]
        logits = jnp.einsum("...e,ev->...v", hidden, out.astype(hidden.dtype),
                            preferred_element_type=jnp.float32)
        if cfg.final_logit_softcap is not None:
            cap = jnp.float32(cfg.final_logit_softcap)
            logits = cap * jnp.tanh(logits / cap)
        return logits

    def forward(self, tokens: Array, positions: Array, segment_ids: Array | None, *,
                memory: kv_cache.Memory | None,
                rotary_positions: Array | None = None) -> tuple[Array, list]:
        """The forward pass proper: (logits float32 [B, T, V], per-layer (k, v) or Nones);
        `trunk` then `head`."""
        hidden, new, _ = self.trunk(tokens, positions, segment_ids, memory=memory,
                                    rotary_positions=rotary_positions)
        return constrain(self.head(hidden), ("batch", "length", "vocab")), new

    def trunk(self, tokens: Array, positions: Array, segment_ids: Array | None, *,
              memory: kv_cache.Memory | None,
              rotary_positions: Array | None = None) -> tuple[Array, list, Array]:
        """Embedding, every block and the final norm: (hidden [B, T, E] in the compute dtype,
        per-layer (k, v) or Nones, the MoE layers' mean load-balancing loss). positions [T] / [B|1, T], or [A, B|1, T] (see `__call__`);
        rotary_positions: set by the cache for A > 1, when positions are already the masks'
        [B, T]."""
        cfg, dt = self.config, self.config.dtype
        b, t = tokens.shape
        positions, rotary = split_positions(positions, cfg.position_axes, t, b)  # [B|1, T]
        rotary = rotary if rotary_positions is None else rotary_positions
        segment_ids = as_2d(segment_ids, t, b, "segment_ids")        # [B|1, T] or None
        emb = self.embedding[...]
        ids = jnp.where(tokens < 0, cfg.vocab_size, tokens)  # out of range: NaN, never a wrap
        x = jnp.take(emb, ids, axis=0, mode="fill", fill_value=jnp.nan).astype(dt)
        scale = features.embed_multiplier(cfg)  # in the activation dtype, as transformers
        x = x if scale is None else x * jnp.asarray(scale, dt)
        x = cfg.input_encoding.embed(_values(self.input_pe), x, positions)
        x = constrain(x.astype(dt), ("batch", "length", "embed"))
        rotary = None if rotary is positions else rotary
        x, new, aux = scan.run_blocks(self.layers, cfg.layer_specs, x, positions, segment_ids,
                                      memory, rotary, scan=cfg.scan_layers, remat=cfg.remat)
        num_moe = sum(spec.moe for spec in cfg.layer_specs)
        return self.final_norm(x), new, aux / max(num_moe, 1)

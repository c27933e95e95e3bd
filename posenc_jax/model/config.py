"""`TransformerConfig`: the decoder LM's hyperparameters, validated at construction.

A frozen (hashable) dataclass, so a config can be a static `jax.jit` argument. Dict-valued
fields (`encoding_kwargs`, the kwargs inside `layer_encodings`) are frozen into hashable
tuples on construction; the built encodings are available as `config.input_encoding` and
`config.layer_encoding(i)`.

Encodings: `encoding` (+ `encoding_kwargs`) is the model's encoding. Its `embed` hook is
applied once, to the scaled token embeddings at the input (sinusoidal, learned); every layer
calls the `rotate` and `bias` hooks of its own encoding, which is `encoding` unless
`layer_encodings` names one per layer -- e.g. Llama 4's interleaving, RoPE on three layers of
four and NoPE on the fourth:

    TransformerConfig(..., encoding="nope",
                      layer_encodings=["rope", "rope", "rope", "nope"] * (num_layers // 4))

Each entry is a name or a `(name, kwargs)` pair. Additive encodings (sinusoidal, learned)
cannot be per-layer: they act only at the input (set them as `encoding`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from posenc_jax._frozen import _FrozenDict, freeze, thaw
from posenc_jax.checks import boolean, finite_float, positive_int
from posenc_jax.encodings import capabilities
from posenc_jax.encodings.base import Encoding, for_model
from posenc_jax.model import backends
from posenc_jax.model.context_parallel import check_mode as check_context_mode
from posenc_jax.model.features import check_features
from posenc_jax.model.kernels.blocks import kernel_blocks
from posenc_jax.model.layer_pattern import LayerSpec, resolve_layers
from posenc_jax.model.mlp import MLP_ACTIVATIONS
from posenc_jax.model.moe import check_moe
from posenc_jax.model.remat import check_remat

__all__ = ["TransformerConfig", "freeze", "thaw"]


def _freeze_kwargs(value: Any, what: str) -> _FrozenDict:
    """A dict of hyperparameters (or a ConfigDict, or (key, value) pairs), frozen."""
    value = thaw(freeze(value or {}))
    if isinstance(value, list):  # (key, value) pairs
        try:
            value = dict(value)
        except (TypeError, ValueError):
            raise TypeError(f"{what} must be a dict, got {value!r}") from None
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, got {value!r}")
    return freeze(value)


def _float_dtype(name: str, value: Any) -> str:
    try:
        dt = jnp.dtype(value)
    except TypeError:
        raise ValueError(f"{name} must be a float dtype, got {name}={value!r}") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"{name} must be a float dtype (e.g. 'float32', 'bfloat16'), got "
                         f"{name}={value!r}")
    return dt.name


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of `posenc_jax.model.transformer.Transformer` (validated on construction).

    Attributes:
      vocab_size: V. num_layers: number of blocks. embed_dim: E. num_heads: H.
      mlp_dim: the MLP's hidden width F.
      num_kv_heads: K for grouped-query attention (None -> H; must divide H).
      head_dim: D (None -> E // H, which then requires H | E).
      mlp_activation: "swiglu", "geglu", "swiglu_clamped" or "gelu" (`posenc_jax.model.mlp`).
      num_experts (0: dense), experts_per_token, moe_mlp_dim (None: mlp_dim), router,
        router_bias, expert_bias, shared_expert_mlp_dim, moe_layers (None: every layer),
        moe_aux_loss_coef: the mixture-of-experts MLP (`posenc_jax.model.moe`).
      encoding, encoding_kwargs: the model's positional encoding, by name (see module doc).
      layer_encodings: None, or one entry per layer: a name or (name, kwargs).
      attention: a backend of `posenc_jax.model.backends` (`backends.names()`: XLA dense,
        blockwise, the Pallas kernel (interpret mode on CPU), cuDNN) or "auto" (what
        `backends.choose` picks per platform); validated by asking the registry whether it
        runs every encoding of the model. block_size: the blockwise block (queries and keys; 128-256 was fastest on a 2-core
        CPU, see benchmarks/attention.py), also the kernel's interpret-mode block.
      kernel_blocks: the kernel's GPU / TPU block sizes per pass, e.g.
        `{"gpu": {"block_q": 128, "num_warps": 8}}` (None: defaults by head dim; see
        `posenc_jax.model.kernels.blocks`); validated here, stored as a `KernelBlocks`.
      causal: decoder (True) or bidirectional attention.
      tie_embeddings: the output projection is the token embedding's transpose.
      dtype: activation/compute dtype; param_dtype: parameter storage dtype.
      norm_eps: RMSNorm epsilon.
      scan_layers: run the blocks as a `jax.lax.scan` over the smallest repeating group of
        layer settings (same params and checkpoints as the loop; a last partial group runs
        unrolled). See `posenc_jax.model.scan`.
      remat: rematerialisation policy of the blocks: "none", "block", "dots" or "attention"
        (`posenc_jax.model.remat`); gradients equal "none"'s.
      context_mode: "ring" or "all_gather": how attention gathers keys when the mesh and
        logical rules split the sequence ("length" -> a mesh axis of size > 1); see
        `posenc_jax.model.context_parallel`. Unused otherwise.
      embed_scale, qkv_bias, o_bias, qk_norm, norm_offset, post_norms, query_pre_attn_scalar,
        final_logit_softcap, attention_sinks, sink_tokens: what pretrained families need
        (Llama has no embedding scale: embed_scale=None); see `posenc_jax.model.features`.
      sliding_window, attention_chunk, layer_pattern, attn_temperature: per-layer settings
        (Gemma 3's windows: sliding_window=([512] * 5 + [None]) * 3; Llama 4's chunks, NoPE
        layers, QK L2-norm and query temperature), resolved into one `LayerSpec` per layer
        (`layer(i)`, `layer_specs`); see `posenc_jax.model.layer_pattern`.
    """

    vocab_size: int
    num_layers: int
    embed_dim: int
    num_heads: int
    mlp_dim: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    mlp_activation: str = "swiglu"
    encoding: str = "rope"
    encoding_kwargs: Any = ()
    layer_encodings: Any = None
    attention: str = backends.DENSE
    block_size: int = 256
    kernel_blocks: Any = None
    causal: bool = True
    tie_embeddings: bool = True
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    norm_eps: float = 1e-6
    scan_layers: bool = False
    context_mode: str = "ring"
    embed_scale: Any = "sqrt"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norm_offset: float = 0.0
    post_norms: bool = False
    query_pre_attn_scalar: float | None = None
    sliding_window: Any = None
    final_logit_softcap: float | None = None
    attention_chunk: Any = None
    layer_pattern: Any = None
    attn_temperature: Any = None
    attention_sinks: bool = False
    sink_tokens: int = 0
    remat: str = "none"
    num_experts: int = 0
    experts_per_token: int = 2
    moe_mlp_dim: int | None = None
    router: str = "softmax_topk_norm"
    router_bias: bool = False
    expert_bias: bool = False
    shared_expert_mlp_dim: int = 0
    moe_layers: Any = None
    moe_aux_loss_coef: float = 0.0

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)

        for name in ("vocab_size", "num_layers", "embed_dim", "num_heads", "mlp_dim"):
            positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.embed_dim % self.num_heads:
                raise ValueError(f"embed_dim={self.embed_dim} must be divisible by num_heads="
                                 f"{self.num_heads} (or give head_dim explicitly)")
            set_("head_dim", self.embed_dim // self.num_heads)
        positive_int("head_dim", self.head_dim)
        if self.num_kv_heads is None:
            set_("num_kv_heads", self.num_heads)
        positive_int("num_kv_heads", self.num_kv_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by num_kv_heads="
                             f"{self.num_kv_heads}")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(f"unknown mlp_activation {self.mlp_activation!r}; valid: "
                             f"{', '.join(map(repr, MLP_ACTIVATIONS))}")
        set_("attention", backends.resolve(self.attention))
        positive_int("block_size", self.block_size)
        set_("kernel_blocks", kernel_blocks(thaw(self.kernel_blocks)))
        set_("dtype", _float_dtype("dtype", self.dtype))
        set_("param_dtype", _float_dtype("param_dtype", self.param_dtype))
        set_("norm_eps", finite_float("norm_eps", self.norm_eps, above=0.0))
        boolean("causal", self.causal)
        boolean("tie_embeddings", self.tie_embeddings)
        set_("encoding_kwargs", _freeze_kwargs(self.encoding_kwargs, "encoding_kwargs"))
        set_("layer_encodings", self._freeze_layers(self.layer_encodings))
        boolean("scan_layers", self.scan_layers)
        set_("remat", check_remat(self.remat))
        check_context_mode(self.context_mode)
        check_features(self, set_)
        check_moe(self, set_)
        specs = resolve_layers(self, set_)
        object.__setattr__(self, "_specs", specs)
        # Build (and so validate) every encoding now; cached outside the dataclass fields.
        encs = {}
        for entry in dict.fromkeys([(self.encoding, self.encoding_kwargs),
                                    *(spec.encoding for spec in specs)]):
            encs[entry] = self._build(*entry)
        object.__setattr__(self, "_encodings", encs)
        for enc in encs.values():
            if self.attention == backends.PALLAS:
                self._check_kernel_lowers(enc)
        axes = sorted({capabilities.position_axes(enc) for enc in encs.values()
                       if enc.hooks})  # those that read positions (not nope)
        if len(axes) > 1:  # e.g. ["mrope", "rope"]: rope would get mrope's [3, B, L]
            raise ValueError(f"the encodings take positions with different axes {axes}; a "
                             "model takes one positions shape")
        default = (self.encoding, self.encoding_kwargs)
        pattern = [dict(e) for e in self.layer_pattern or ()]
        for i, spec in enumerate(specs):
            if spec.encoding != default and "embed" in encs[spec.encoding].hooks:
                where = (f"layer_pattern[{i % len(pattern)}]['encoding']"
                         if any("encoding" in e for e in pattern) else f"layer_encodings[{i}]")
                raise ValueError(
                    f"{where}={spec.encoding[0]!r} is additive (an embed hook); additive "
                    f"encodings act only at the input: set encoding={spec.encoding[0]!r} "
                    "instead")
        self._check_masks(specs)

    def _check_masks(self, specs: tuple[LayerSpec, ...]) -> None:
        """ValueError unless the attention backend runs every distinct layer: its encoding,
        window, chunk and the sinks (`backends.check`, which names the backends that can)."""
        if self.sink_tokens and not any(s.window or s.chunk for s in specs):
            raise ValueError(f"sink_tokens={self.sink_tokens} keeps the first keys visible "
                             "beside a sliding window or a chunk, but no layer has one (set "
                             "sliding_window, attention_chunk or layer_pattern)")
        for spec in dict.fromkeys(specs):
            backends.check(self.attention, self._encodings[spec.encoding], causal=self.causal,
                           shapes=self.attention_shapes(spec))

    def attention_shapes(self, spec: LayerSpec, *, batch: int = 1, q_len: int = 1,
                         k_len: int = 1) -> backends.Shapes:
        """The `backends.Shapes` of a layer with settings `spec`: heads, the window, and the
        chunk / sinks / sink tokens where the layer uses them (`attention_masks`)."""
        return backends.Shapes(batch=batch, q_len=q_len, k_len=k_len, heads=self.num_heads,
                               kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                               window=spec.window, **self.attention_masks(spec, sinks=True))

    def attention_masks(self, spec: LayerSpec, *, sinks: Any = None) -> dict:
        """The chunk / sinks / sink-token keywords of `attend` for a layer with settings `spec`,
        only those it uses (a layer without them calls `attend` as before they existed):
        chunk_size, sinks (the `sinks` value given, when `attention_sinks`), sink_tokens
        (beside a window or a chunk)."""
        out: dict = {}
        if spec.chunk is not None:
            out["chunk_size"] = spec.chunk
        if self.attention_sinks:
            out["sinks"] = sinks
        if self.sink_tokens and (spec.window is not None or spec.chunk is not None):
            out["sink_tokens"] = self.sink_tokens
        return out

    def _check_kernel_lowers(self, enc: Encoding) -> None:
        """ValueError naming the shape when the backend cannot run `enc` on this host's GPU /
        TPU: the registry's `check` with the host platform (CPU hosts: nothing to trial)."""
        platform = backends.host_platform()
        if platform is None:
            return
        shapes = backends.Shapes(batch=1, q_len=1, k_len=1, heads=self.num_heads,
                                 kv_heads=self.num_kv_heads, head_dim=self.head_dim)
        backends.check(self.attention, enc, causal=self.causal, shapes=shapes,
                       platform=platform)

    def _freeze_layers(self, layers: Any) -> tuple | None:
        if layers is None:
            return None
        if isinstance(layers, str) or not hasattr(layers, "__len__"):
            raise ValueError(f"layer_encodings must be a sequence of num_layers={self.num_layers}"
                             f" entries, got {layers!r}")
        if len(layers) != self.num_layers:
            raise ValueError(f"layer_encodings has {len(layers)} entries but num_layers="
                             f"{self.num_layers}")
        return tuple(self.freeze_encoding(entry, f"layer_encodings[{i}]")
                     for i, entry in enumerate(layers))

    @staticmethod
    def freeze_encoding(entry: Any, what: str) -> tuple:
        """A per-layer encoding entry (a name or (name, kwargs)) as (name, frozen kwargs)."""
        if isinstance(entry, str):
            return (entry, freeze({}))
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str):
            return (entry[0], _freeze_kwargs(entry[1], f"{what} kwargs"))
        raise ValueError(f"{what} must be a name or (name, kwargs), got {entry!r}")

    def _build(self, name: str, kwargs: Any) -> Encoding:
        return for_model(name, thaw(kwargs), embed_dim=self.embed_dim, num_heads=self.num_heads,
                         head_dim=self.head_dim)

    @property
    def input_encoding(self) -> Encoding:
        """The encoding whose `embed` hook acts at the input."""
        return self._encodings[(self.encoding, self.encoding_kwargs)]

    def layer_encoding(self, i: int) -> Encoding:
        """The encoding whose `rotate` and `bias` hooks layer `i` calls."""
        return self._encodings[self._specs[i].encoding]

    def encoding_for(self, spec: LayerSpec) -> Encoding:
        """The built encoding of a layer with settings `spec`."""
        return self._encodings[spec.encoding]

    def layer(self, i: int) -> LayerSpec:
        """Layer i's settings: encoding, window, chunk, QK L2-norm, temperature."""
        return self._specs[i]

    @property
    def layer_specs(self) -> tuple[LayerSpec, ...]:
        """One `LayerSpec` per layer (`posenc_jax.model.layer_pattern`)."""
        return self._specs

    @property
    def position_axes(self) -> int:
        """Axes of the positions the model takes: 1 ([L] or [B, L]), or the A > 1 that some
        encoding declares (positions [A, B, L], e.g. multimodal RoPE's A = 3)."""
        return max(capabilities.position_axes(enc) for enc in self._encodings.values())

    @property
    def is_length_dependent(self) -> bool:
        """True when some layer's rotation depends on the sequence length (dynamic, LongRoPE)."""
        return any(capabilities.is_length_dependent(self.layer_encoding(i))
                   for i in range(self.num_layers))

    @property
    def max_positions(self) -> int | None:
        """The number of positions the input encoding can encode (None: unbounded), e.g. a
        learned table's max_len (`capabilities.MaxPositions`)."""
        return capabilities.max_positions(self.input_encoding)

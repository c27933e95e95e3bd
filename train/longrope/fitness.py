"""The search's fitness: perplexity at the target length of a pretrained model with candidate
factors (LongRoPE's objective, Ding et al. 2024, eq. 3), on the user's text.

    fit = Perplexity.load("SmolLM2.gguf", target_length=16384, text="book.txt", samples=2)
    fit = Perplexity.of_model(model, tokens, original=128)     # a model of ours (a study's)
    fit(candidate)                       # exp(mean next-token NLL over the windows), float
    fit.space(starts=(0,)), fit.seeds(space)

One compiled program per search. The checkpoint is read once. The candidate's factors do not
enter the program: its scaled RoPE layers are built with `frequency_table=True`
(`posenc_jax.encodings.rope.RoPE`), so the rotation is read from three params per layer
(inverse frequencies [R], attention factor, start count), and a candidate is only new values
for them (`tables`: the static encoding's own `frequency_params` at the target length, so the
runtime rotation is the static one's to float32 rounding). `window_nll` is jitted once for the model's
graph and the windows' shape, and every candidate, of this search or of any other on a model
of the same shape (a study's seeds), reuses that compile. `config(candidate)` and
`model(candidate)` are the static model the search's result describes (what `pretrained.load`
builds from the exported dict).

Windows: the text's tokens (a file, or every file under a directory, sorted, joined by blank
lines), cut into `samples` consecutive windows of `target_length` tokens, positions 0..L-1, the
loss on predicting tokens 1..L-1, one window at a time, the head applied 1024 positions at a
time (`posenc_jax.model.loss.token_nll`: the [L, V] logits are never held).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.checks import integer
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.loss import token_nll
from posenc_jax.model.transformer import Transformer
from posenc_jax.pretrained.families import config_kwargs
from posenc_jax.pretrained.loader import with_rope_scaling
from train.longrope import export
from train.longrope.space import PAPER_STARTS, Candidate, Space, seeds

__all__ = ["TABLE_KEYS", "Perplexity", "read_text", "window_nll", "windows"]

#: The params of a `frequency_table` RoPE layer (`RoPE.frequency_params`).
TABLE_KEYS = ("inv_freq", "attention_factor", "unscaled_start")


def read_text(path: str | os.PathLike) -> str:
    """A file's text, or every file's under a directory (sorted paths, blank lines between)."""
    p = pathlib.Path(path)
    if p.is_file():
        return p.read_text(encoding="utf-8", errors="replace")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file())
        if files:
            return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    raise ValueError(f"text={str(path)!r}: no such file, or a directory without files")


def windows(ids, *, target_length: int, samples: int) -> np.ndarray:
    """int32 [samples, target_length]: consecutive windows of the token ids; ValueError naming
    how many tokens there are and how many are needed when the text is too short."""
    ids = np.asarray(ids, np.int32)
    need = integer("target_length", target_length, minimum=2) * integer("samples", samples,
                                                                        minimum=1)
    if ids.size < need:
        raise ValueError(f"the text has {ids.size} tokens; {samples} window(s) of "
                         f"target_length={target_length} need {need}: give more text or fewer "
                         "samples")
    return ids[:need].reshape(samples, target_length)


class Perplexity:
    """fitness(candidate) -> perplexity at the target length of a model with the candidate's
    factors. `Perplexity.load` (a checkpoint and a text file), `Perplexity.pretrained` (a
    loaded checkpoint) or `Perplexity.of_model` (a model of ours, e.g. a study's) build one;
    the constructor takes `rebuild(scaling dict) -> TransformerConfig`, the model's config with
    that dict at every layer that takes one."""

    def __init__(self, model: Transformer, tokens: np.ndarray, *, original: int,
                 rebuild: Callable[[dict], TransformerConfig], where: str = "the model",
                 step: float = 0.01, scan_layers: bool = True, chunk: int = 1024):
        self.tokens, self.where, self.rebuild = np.asarray(tokens), where, rebuild
        self.step = step  # the grid of the candidates' factors (`Space.step`)
        self.scan_layers, self.chunk = scan_layers, chunk
        self.target_length = int(self.tokens.shape[1])
        self.original = integer("original", original, minimum=1)
        self._check_length()
        self.source, self.state = model, nnx.state(model)
        probe = rebuild({"rope_type": "linear", "factor": self.scale})
        scaled = [probe.layer_encoding(i) for i in range(probe.num_layers)
                  if getattr(probe.layer_encoding(i), "scaling", None) is not None]
        if not scaled:
            raise ValueError(f"{where}: no layer takes the longrope scaling (no RoPE layer)")
        self.pairs, self.base = scaled[0].rotary_dim // 2, float(scaled[0].base)

    @classmethod
    def pretrained(cls, lm: pretrained.Pretrained, tokens: np.ndarray, *, where: str,
                   attention: str = "dense", **kwargs) -> Perplexity:
        """For a loaded checkpoint: its config.json rebuilt with each candidate's dict (as
        `pretrained.load(..., rope_scaling=...)` builds it; Gemma 3: the full-attention
        layers), L0 its max_position_embeddings."""
        def rebuild(scaling):
            hf = with_rope_scaling(lm.hf_config, scaling)
            return TransformerConfig(**config_kwargs(hf, where=where), dtype=lm.config.dtype,
                                     param_dtype=lm.config.param_dtype, attention=attention)

        original = int(lm.hf_config.get("max_position_embeddings") or 0)
        return cls(lm.model, tokens, original=original, rebuild=rebuild, where=where, **kwargs)

    @classmethod
    def of_model(cls, model: Transformer, tokens: np.ndarray, *, original: int,
                 **kwargs) -> Perplexity:
        """For a model of ours trained at length `original`: every RoPE layer takes the
        candidate's dict (`export.with_scaling`)."""
        return cls(model, tokens, original=original, **kwargs,
                   rebuild=lambda scaling: export.with_scaling(model.config, scaling))

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, *, target_length: int, text: str,
             samples: int = 1, attention: str = "dense", dtype: str = "float32",
             **kwargs) -> Perplexity:
        """Reads the checkpoint and tokenizes `text` (a path: `read_text`)."""
        lm = pretrained.load(checkpoint, dtype=dtype, attention=attention)
        if lm.tokenizer is None:
            raise ValueError(f"checkpoint={str(checkpoint)!r} has no tokenizer to read the text")
        ids = lm.tokenizer.encode(read_text(text))
        tokens = windows(ids, target_length=target_length, samples=samples)
        return cls.pretrained(lm, tokens, where=str(checkpoint), attention=attention, **kwargs)

    def _check_length(self) -> None:
        if self.target_length <= self.original:
            raise ValueError(f"target_length={self.target_length} must exceed {self.where}'s "
                             f"original context max_position_embeddings={self.original}")

    @property
    def scale(self) -> float:
        return self.target_length / self.original

    def space(self, *, starts=None, **kwargs) -> Space:
        """The paper's space for this model and target length (`Space`'s keywords); the
        default starts are the paper's below the original length (all of them from L0 = 257)."""
        if starts is None:
            starts = [n for n in PAPER_STARTS if n < self.original]
        return Space(pairs=self.pairs, scale=self.scale, starts=tuple(starts), step=self.step,
                     **kwargs)

    def seeds(self, space: Space) -> list[Candidate]:
        return seeds(space, original_max_position_embeddings=self.original, base=self.base)

    def scaling(self, candidate: Candidate) -> dict:
        """The candidate's longrope dict (its start count is not in it)."""
        return export.scaling_dict(candidate, step=self.step, target_length=self.target_length,
                                   original_max_position_embeddings=self.original)

    def start(self, candidate: Candidate) -> int:
        """The count of first positions kept at the original rotation: the candidate's."""
        return candidate.start

    def config(self, candidate: Candidate) -> TransformerConfig:
        """The model config with the candidate's factors and start count."""
        cfg = export.with_start(self.rebuild(self.scaling(candidate)),
                                self.start(candidate))
        if self.scan_layers and cfg.layer_encodings is None:  # one encoding: compile once, not
            cfg = dataclasses.replace(cfg, scan_layers=True)  # per layer (same params)
        return cfg

    def model(self, candidate: Candidate) -> Transformer:
        """The loaded model with the candidate's factors (its params, shared, not copied)."""
        cfg = self.config(candidate)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        return nnx.merge(graphdef, self.state)

    @functools.cached_property
    def program(self) -> tuple[nnx.GraphDef, nnx.State]:
        """(graphdef, abstract tables): the model with every scaled RoPE layer reading its
        rotation from params (`export.with_frequency_table`), the graph `window_nll` compiles
        once; the tables are its `TABLE_KEYS` params, filled per candidate by `tables`."""
        ones = Candidate((round(1 / self.step),) * self.pairs, 0)  # any candidate: the graph
        cfg = export.with_frequency_table(self.config(ones))       # does not hold its values
        abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, tables, _ = nnx.split(abstract, _is_table, ...)
        return graphdef, tables

    def tables(self, candidate: Candidate) -> nnx.State:
        """The candidate's rotation as the params of `program`'s tables: at each layer, the
        static encoding's `frequency_params` at the target length (float32)."""
        cfg = self.config(candidate)
        _, abstract = self.program
        params = {}

        def fill(path, variable):
            layer = path[path.index("layers") + 1]
            if layer not in params:
                params[layer] = cfg.layer_encoding(layer).frequency_params(self.target_length)
            return variable.replace(params[layer][path[-1]])

        return nnx.map_state(fill, abstract)

    def nll(self, candidate: Candidate) -> float:
        """Mean next-token negative log-likelihood over the windows (nats)."""
        graphdef, _ = self.program
        tables = self.tables(candidate)
        total = sum(float(window_nll(self.state, tables, jnp.asarray(row[None]),
                                     graphdef=graphdef, chunk=self.chunk))
                    for row in self.tokens)
        return total / (self.tokens.shape[0] * (self.target_length - 1))

    def __call__(self, candidate: Candidate) -> float:
        nll = self.nll(candidate)
        return math.exp(nll) if nll < 700 else math.inf


def _is_table(path, value) -> bool:
    """An nnx filter: the `TABLE_KEYS` params of a layer's encoding."""
    del value
    return len(path) >= 2 and path[-2] == "pe" and path[-1] in TABLE_KEYS


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def window_nll(state: nnx.State, tables: nnx.State, tokens: jax.Array, *,
               graphdef: nnx.GraphDef, chunk: int = 1024) -> jax.Array:
    """The summed NLL of tokens 1..L-1 of one window, float32 []: the model `graphdef` with the
    weights `state` and the rotation `tables` (`Perplexity.program`), tokens int32 [1, L].
    Jitted once per graph and shape (jax's own cache): new tables are new inputs, not a new
    program. The head runs `chunk` positions at a time (`posenc_jax.model.loss`)."""
    model = nnx.merge(graphdef, tables, state)
    hidden = model.hidden_states(tokens)[:, :-1]                           # [1, L-1, E]
    return jnp.sum(token_nll(model.head, hidden, tokens[:, 1:], chunk=chunk))

"""A GGUF file (llama.cpp's format) read as a Hugging Face checkpoint, one tensor at a time.

    ckpt = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ckpt.config                  # the config.json dict transformers builds (gguf_config.hf_config)
    ckpt.names()                 # ["model.embed_tokens.weight", "model.layers.0....", ...]
    ckpt.shape(name)             # (49152, 576): Hugging Face layout, [out, in] for a linear layer
    ckpt.tensor(name)            # np.ndarray float32, dequantised with gguf.quants.dequantize
    ckpt.field("tokenizer.ggml.tokens")   # any metadata value (the tokenizer reads its own)

`tensor` gives exactly what transformers 5.24 holds after loading the file: the family record's
GGUF fixes are applied (`Family.gguf.fixes`: llama.cpp stores the llama architecture's q/k
projection rows permuted for its interleaved RoPE, per head [d/2 pairs, 2] -> [2, d/2], and
they are put back; Gemma's `*norm.weight` are stored as 1 + w and come back as w, the model
adding the 1). The file is memory-mapped: nothing but the
metadata is read until a tensor is asked for. A file that is not GGUF, is truncated, or holds a
names a tensor twice, has a metadata value of the wrong type (`gguf_metadata`), or holds a tensor
that is not floating point or does not dequantise to finite values (`tensor_values`) raises
ValueError naming the file (and the key or tensor). `rope_freqs.weight` (llama.cpp's Llama 3.1
frequency divisors) is no parameter: it is read into `config["rope_parameters"]`
(`gguf_rope`; transformers drops it) and left out of `names()`; any other unknown tensor name is
an error, not a silent skip.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
from gguf import quants

from posenc_jax.pretrained import gguf_config, gguf_format, gguf_metadata, gguf_rope
from posenc_jax.pretrained.families import for_gguf
from posenc_jax.pretrained.families.transforms import unpermute_rows as _unpermute_rows  # noqa: F401 (tests)
from posenc_jax.pretrained.tensor_values import checked_weights, float_dtype

__all__ = ["GGUFCheckpoint", "open_gguf"]


class GGUFCheckpoint:
    """One GGUF file as a checkpoint (see the module docstring). Build with `open_gguf`."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        parsed = gguf_format.read_gguf(self.path)
        self._fields = gguf_metadata.checked_fields(parsed, where=str(self.path))
        self.arch = self._fields.get("general.architecture")
        file_names = [t.name for t in parsed.tensors]
        apart = {t.name: t for t in parsed.tensors if t.name in gguf_config.READ_APART}
        freqs = apart.get(gguf_rope.ROPE_FREQS)
        self.config = gguf_config.hf_config(
            self._fields, file_names, where=str(self.path),
            rope_freqs=None if freqs is None else self._values(freqs, freqs.name))
        self._spec = for_gguf(self._fields, where=str(self.path)).gguf
        self._tensors: dict[str, gguf_format.TensorInfo] = {}
        for t in parsed.tensors:
            if t.name in apart:
                continue
            hf = gguf_config.hf_tensor_name(t.name, self._spec)
            if hf is None:
                raise ValueError(f"{self.path}: tensor {t.name!r}: no Hugging Face "
                                 f"{self.config['model_type']} parameter has this GGUF name")
            self._tensors[hf] = t

    def field(self, key: str, default: Any = None) -> Any:
        """The metadata value under `key`: int, float, bool, str, list[str] or a 1-D numpy
        array (numeric arrays such as tokenizer.ggml.scores); `default` when absent."""
        return self._fields.get(key, default)

    def field_keys(self) -> list[str]:
        return list(self._fields)

    def names(self) -> list[str]:
        """Hugging Face names of the file's tensors, in the file's order."""
        return list(self._tensors)

    def gguf_name(self, name: str) -> str:
        return self._info(name).name

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in Hugging Face layout (outermost first), without reading it."""
        return self._info(name).shape

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` (a Hugging Face name) as a new float32 array in Hugging Face layout."""
        t = self._info(name)
        w = self._values(t, name)
        fix = self._spec.fixes.get(gguf_config.gguf_part(t.name))
        if fix is not None:
            w = fix(w, self.config)
        return np.array(w, dtype=np.float32, copy=True)

    def _values(self, t: gguf_format.TensorInfo, name: str) -> np.ndarray:
        """Tensor `t` dequantised, in Hugging Face layout, checked finite (`name` in errors)."""
        float_dtype(self.path, name, t.ggml_type.name, gguf=True)  # I8..I64: refused
        try:
            w = np.asarray(quants.dequantize(t.data, t.ggml_type))
        except (NotImplementedError, ValueError) as e:
            raise ValueError(f"{self.path}: tensor {name!r} (GGUF {t.name!r}, "
                             f"{t.ggml_type.name}): cannot dequantise: {e}") from e
        return checked_weights(self.path, name, w.reshape(t.shape), also=f" (GGUF {t.name!r})")

    def _info(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r} (it has {len(self._tensors)}, "
                           f"e.g. {', '.join(list(self._tensors)[:3])})") from None

    def __repr__(self) -> str:
        return (f"GGUFCheckpoint({str(self.path)!r}, model_type={self.config['model_type']!r}, "
                f"{len(self._tensors)} tensors)")


def open_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Open GGUF file `path` as a checkpoint. FileNotFoundError if it is not there,
    ValueError (naming the file) if it is not a GGUF file of a supported architecture."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"open_gguf: path must be a str or os.PathLike, got {type(path).__name__}")
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    return GGUFCheckpoint(path)


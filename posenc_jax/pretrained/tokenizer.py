"""The tokenizer of a pretrained checkpoint: from tokenizer.json or from a GGUF file.

    tok = Tokenizer.from_directory("path/to/hf_dir")     # tokenizer.json (the tokenizers package)
    tok = Tokenizer.from_gguf("model.gguf")              # the file's own vocabulary and merges
    ids = tok.encode("The capital of France is")         # list[int]; BOS as the checkpoint adds it
    tok.decode(ids)                                      # str
    tok.bos_id, tok.eos_id                               # int or None

`encode(text, add_bos=None)` gives the ids transformers' tokenizer gives for `tokenizer(text)`
(its special tokens: Gemma 3 prepends <bos>, SmolLM2 adds nothing); `add_bos=True / False`
forces BOS on or off (no other special token is added then). Special tokens written in the text
(e.g. "<|im_start|>") always become their one id. `decode(ids, skip_special_tokens=False)`.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
from tokenizers import Tokenizer as _HFTokenizer

from posenc_jax.pretrained import gguf as gguf_reader
from posenc_jax.pretrained import gguf_tokenizer

__all__ = ["Tokenizer"]


class Tokenizer:
    """A `tokenizers.Tokenizer` with the checkpoint's BOS / EOS ids. Build with `from_directory`
    or `from_gguf`."""

    def __init__(self, backend: _HFTokenizer, *, bos_id: int | None, eos_id: int | None,
                 source: str):
        if not isinstance(backend, _HFTokenizer):
            raise TypeError(f"Tokenizer: backend must be a tokenizers.Tokenizer, got "
                            f"{type(backend).__name__}")
        self.backend, self.bos_id, self.eos_id, self.source = backend, bos_id, eos_id, source

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text` (see the module docstring for `add_bos`)."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        if add_bos is None:
            return list(self.backend.encode(text, add_special_tokens=True).ids)
        ids = list(self.backend.encode(text, add_special_tokens=False).ids)
        if add_bos:
            if self.bos_id is None:
                raise ValueError(f"encode: add_bos=True but {self.source} names no BOS token")
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        """The text of token ids `ids` (a sequence of ints, or a 1-D integer array); TypeError
        for a float, str or bool id, ValueError for one outside the vocabulary."""
        if isinstance(ids, np.ndarray) or hasattr(ids, "__array__"):
            ids = np.asarray(ids).tolist() if np.asarray(ids).ndim == 1 else ids
        wrong = next((i for i in ids if isinstance(i, (bool, np.bool_))
                      or not isinstance(i, (int, np.integer))), None)
        if wrong is not None:
            raise TypeError(f"decode: ids must be ints (token ids), got {wrong!r} "
                            f"({type(wrong).__name__}) in ids")
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"decode: ids {bad[:5]} are outside the vocabulary "
                             f"[0, {self.vocab_size}) of {self.source}")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> Tokenizer:
        """tokenizer.json in `directory`; BOS / EOS from tokenizer_config.json's bos_token /
        eos_token, else config.json's bos_token_id / eos_token_id."""
        d = pathlib.Path(directory)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{d}: no tokenizer.json")
        try:
            backend = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers package raises its own Exception type
            raise ValueError(f"{path}: not a readable tokenizer.json: {e}") from e
        ids = {"bos": None, "eos": None}
        for name in ("config.json", "tokenizer_config.json"):  # the latter wins
            f = d / name
            if not f.is_file():
                continue
            try:
                cfg = json.loads(f.read_text(encoding="utf-8"))
            except ValueError as e:
                raise ValueError(f"{f}: not valid JSON: {e}") from e
            for k in ids:
                token = cfg.get(f"{k}_token")
                if isinstance(token, dict):  # a serialised AddedToken
                    token = token.get("content")
                if isinstance(token, str) and backend.token_to_id(token) is not None:
                    ids[k] = backend.token_to_id(token)
                elif isinstance(cfg.get(f"{k}_token_id"), int):
                    ids[k] = cfg[f"{k}_token_id"]
        return cls(backend, bos_id=ids["bos"], eos_id=ids["eos"], source=str(path))

    @classmethod
    def from_gguf(cls, path_or_checkpoint) -> Tokenizer:
        """The tokenizer a GGUF file describes (a path, or an open GGUFCheckpoint)."""
        ckpt = (path_or_checkpoint if isinstance(path_or_checkpoint, gguf_reader.GGUFCheckpoint)
                else gguf_reader.open_gguf(path_or_checkpoint))
        embed = "model.embed_tokens.weight"
        rows = ckpt.shape(embed)[0] if embed in ckpt.names() else None
        backend, info = gguf_tokenizer.build_gguf_tokenizer(ckpt.field, where=str(ckpt.path),
                                                            rows=rows)
        return cls(backend, bos_id=info["bos_id"], eos_id=info["eos_id"], source=str(ckpt.path))

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab={self.vocab_size}, bos={self.bos_id}, " \
               f"eos={self.eos_id})"

"""Documents of bytes -> token ids of a pretrained checkpoint's tokenizer.

    docs = tokenized.TokenizedDocuments(source, tokenizer, eos_join=False)
    docs[i]          # int32 [N_i]: document i's text, tokenized (EOS appended with eos_join)

The text sources of `train.data` (the bundled corpus, a user's files or folders, a TFDS /
array_record dataset) hand out documents as UTF-8 bytes; a fine-tune of a pretrained model
reads them through the model's own tokenizer (`posenc_jax.pretrained.tokenizer.Tokenizer`).
Bytes that are not UTF-8 are replaced (U+FFFD), never dropped silently into a shorter
document. `eos_join=True` appends the tokenizer's EOS to every document: the windows then
cross document boundaries joined by EOS, as pretraining corpora are packed; with the stream's
`packed` flag instead, boundaries become segment ids (`train.data`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TokenizedDocuments:
    """A random-access sequence of token-id documents (int32 [N_i]) over `source`, a
    sequence of byte documents; `identity` names the source and the tokenizer."""

    def __init__(self, source: Sequence, tokenizer, *, eos_join: bool = False,
                 batch: int = 64):
        if eos_join and tokenizer.eos_id is None:
            raise ValueError(f"config.dataset.eos_join=True but the tokenizer "
                             f"{tokenizer.source} names no EOS token")
        self.source, self.tokenizer, self.eos_join, self.batch = source, tokenizer, eos_join, batch
        self.identity = {**dict(getattr(source, "identity", {}) or {}),
                         "tokenizer": str(tokenizer.source), "eos_join": bool(eos_join)}

    def __len__(self) -> int:
        return len(self.source)

    def _encode(self, docs: list) -> list[np.ndarray]:
        texts = [bytes(np.asarray(d, np.uint8)).decode("utf-8", errors="replace") for d in docs]
        encoded = self.tokenizer.backend.encode_batch(texts, add_special_tokens=False)
        tail = [self.tokenizer.eos_id] if self.eos_join else []
        return [np.asarray(list(e.ids) + tail, np.int32) for e in encoded]

    def __getitem__(self, index: int) -> np.ndarray:
        return self._encode([self.source[index]])[0]

    def iter_batches(self):
        """All documents in order, tokenized `batch` at a time (the tokenizer's threads)."""
        for first in range(0, len(self), self.batch):
            yield from self._encode([self.source[i]
                                     for i in range(first, min(first + self.batch, len(self)))])


def check_vocabulary(tokenizer, vocab_size: int, *, where: str) -> None:
    """ValueError naming both sizes when the tokenizer has more ids than the model's
    vocabulary (its ids past V would index no embedding row)."""
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} ids, "
                         f"more than the model's vocab_size={vocab_size} ({where}): it is not "
                         "this model's tokenizer")

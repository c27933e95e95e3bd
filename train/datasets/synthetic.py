"""Synthetic byte tasks for length generalisation, computed on demand from (seed, split, index).

Nothing is stored: document `i` of a split is a pure function of `(seed, split, i)` through
`np.random.default_rng([seed, split_id, i])`, so every process and every run sees the same
documents, and the validation/test splits use their own random streams. Each document is
about `length` bytes with `length` drawn uniformly from [min_len, max_len] and ends with an
answer the model can only produce by using earlier context:

- `copy`:         `<payload>=<payload>\\n`, payload random lowercase letters; the answer is the
                  second copy.
- `passkey`:      filler sentences with `key=12345. ` inserted at a random sentence
                  boundary, ending `key=12345\\n` (`train.datasets.passkey`, whose eval
                  sets the study scores); the answer is the last key.
- `assoc_recall`: `abc=42 xyz=07 ... ? xyz=07\\n` (distinct 3-letter keys, 2-digit values); the
                  answer is the queried value.

`task.answer_span(i)` -> (start, stop): `task[i][start:stop]` is the answer, for accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posenc_jax import checks
from train.datasets import passkey

TASKS = ("copy", "passkey", "assoc_recall")
_SPLIT_IDS = {"train": 0, "validation": 1, "test": 2}
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


def _copy(rng: np.random.Generator, length: int) -> tuple[bytes, int, int]:
    n = max(1, (length - 2) // 2)
    payload = _LETTERS[rng.integers(0, 26, size=n)].tobytes()
    return payload + b"=" + payload + b"\n", n + 1, 2 * n + 1


_PASSKEY_DIGITS = 5


def _passkey(rng: np.random.Generator, length: int) -> tuple[bytes, int, int]:
    doc = passkey.document(rng, max(length, passkey.min_length(_PASSKEY_DIGITS)),
                           digits=_PASSKEY_DIGITS)
    return doc + b"\n", len(doc) - _PASSKEY_DIGITS, len(doc)


def _assoc_recall(rng: np.random.Generator, length: int) -> tuple[bytes, int, int]:
    num_pairs = max(1, (length - 9) // 7)
    codes = rng.choice(26**3, size=num_pairs, replace=False)
    keys = [_LETTERS[[c // 676, c // 26 % 26, c % 26]].tobytes() for c in codes]
    values = [b"%02d" % v for v in rng.integers(0, 100, size=num_pairs)]
    asked = int(rng.integers(0, num_pairs))
    body = b" ".join(k + b"=" + v for k, v in zip(keys, values))
    doc = body + b" ? " + keys[asked] + b"=" + values[asked]
    return doc + b"\n", len(doc) - 2, len(doc)


_MAKERS = {"copy": _copy, "passkey": _passkey, "assoc_recall": _assoc_recall}


class SyntheticTask(Sequence):
    """`num_examples` documents of one task and split; `task[i]` -> uint8 [about length]."""

    def __init__(self, task: str, split: str, *, seed: int = 0, num_examples: int = 10_000,
                 min_len: int = 64, max_len: int = 512):
        checks.one_of("synthetic task", task, TASKS)
        if split not in _SPLIT_IDS:
            raise ValueError(f"synthetic task {task!r} has splits {tuple(_SPLIT_IDS)} (no "
                             f"slicing), got split={split!r}")
        checks.integer("seed", seed, minimum=0)
        checks.positive_int("num_examples", num_examples)
        checks.positive_int("min_len", min_len)
        checks.positive_int("max_len", max_len)
        if min_len > max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, "
                             f"max_len={max_len}")
        self.task, self.split, self.seed = task, split, int(seed)
        self.num_examples, self.min_len, self.max_len = int(num_examples), min_len, max_len
        self.identity = {"name": task, "split": split, "seed": self.seed,
                         "num_examples": self.num_examples, "min_len": min_len,
                         "max_len": max_len, "generator": "np.random.default_rng([seed, "
                         f"{_SPLIT_IDS[split]} (split id), index])"}

    def __len__(self) -> int:
        return self.num_examples

    def example(self, index: int) -> tuple[bytes, int, int]:
        """(document bytes, answer start, answer stop) of document `index`."""
        if not 0 <= index < self.num_examples:
            raise IndexError(f"index {index} out of range for {self.num_examples} documents")
        rng = np.random.default_rng([self.seed, _SPLIT_IDS[self.split], int(index)])
        length = int(rng.integers(self.min_len, self.max_len + 1))
        return _MAKERS[self.task](rng, length)

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        if index < 0:
            index += self.num_examples
        return np.frombuffer(self.example(index)[0], dtype=np.uint8)

    def answer_span(self, index: int) -> tuple[int, int]:
        """(start, stop) such that `self[index][start:stop]` is the answer."""
        _, start, stop = self.example(index)
        return start, stop

    def __repr__(self) -> str:
        return (f"SyntheticTask({self.task!r}, {self.split!r}, seed={self.seed}, "
                f"num_examples={self.num_examples}, len {self.min_len}..{self.max_len})")

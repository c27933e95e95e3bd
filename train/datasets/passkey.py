"""Passkey retrieval (Mohtashami & Jaggi 2023; the test of the YaRN and LongRoPE papers), in bytes.

A document of exactly `length` bytes: filler sentences with a needle hidden at a random depth,
and the question at the very end, whose answer is the last `digits` bytes:

    The sky is blue. Here we go. key=48213. The grass is green. ... The sun key=48213
    \\_____ filler ________________/\\_ needle _/\\_____ filler ______________/\\_ question/

The question repeats the needle's prefix (`key=`, the only `=` in the document), so retrieving
the key is one copy from wherever the needle is: what an induction head does, and what a small
model can learn in a few hundred steps at L = 64. The filler is predictable and carries no digits, so the key can only come from
the needle. The depth is a uniform sentence boundary of the filler; the key is uniform over
10^(digits-1) .. 10^digits - 1 (a guess succeeds with probability about 10^-digits).

    document(rng, length, digits=5) -> bytes            exactly `length` bytes, ends with the key
    eval_set(length, trials=, seed=, digits=) -> EvalSet    deterministic per (length, seed)
    min_length(digits) -> int                           the shortest document that fits

The eval set's document t is a pure function of (seed, length, t) through
`np.random.default_rng([_EVAL_STREAM, seed, length, t])`, a stream no training split uses.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from posenc_jax import checks

FILLER = (b"The grass is green. ", b"The sky is blue. ", b"The sun is yellow. ",
          b"Here we go. ", b"There and back again. ")
NEEDLE_PREFIX = b"key="
_EVAL_STREAM = 7  # keeps eval documents off the synthetic task's split ids (0, 1, 2)


def min_length(digits: int = 5) -> int:
    """Bytes of a document with no filler: needle `key=<key>. ` plus question."""
    return len(NEEDLE_PREFIX) + digits + 2 + len(NEEDLE_PREFIX) + digits


def _check(length: int, digits: int) -> None:
    checks.integer("digits", digits, minimum=1, maximum=18)
    checks.integer("length", length)
    if length < min_length(digits):
        raise ValueError(f"a passkey document with digits={digits} needs length >= "
                         f"{min_length(digits)} bytes, got length={length}")


def _filler(rng: np.random.Generator, room: int) -> tuple[bytes, list[int]]:
    """`room` bytes of random filler sentences (the last one cut) and the sentence
    boundaries in it (0 included)."""
    parts, total, bounds = [], 0, [0]
    while total < room:
        sentence = FILLER[int(rng.integers(0, len(FILLER)))]
        parts.append(sentence)
        total += len(sentence)
        if total <= room:
            bounds.append(total)
    return b"".join(parts)[:room], bounds


def document(rng: np.random.Generator, length: int, *, digits: int = 5) -> bytes:
    """One passkey document of exactly `length` bytes, ending with the key's `digits` bytes."""
    _check(length, digits)
    key = b"%d" % int(rng.integers(10 ** (digits - 1), 10**digits))
    needle = NEEDLE_PREFIX + key + b". "
    room = length - len(needle) - len(NEEDLE_PREFIX) - digits
    filler, bounds = _filler(rng, room)
    cut = bounds[int(rng.integers(0, len(bounds)))]
    doc = filler[:cut] + needle + filler[cut:] + NEEDLE_PREFIX + key
    assert len(doc) == length, (len(doc), length)
    return doc


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """`tokens` uint8 [T, length]: T documents of exactly `length` bytes; the key of each is
    its last `digits` bytes (`tokens[:, -digits:]`); `depths` int64 [T] the byte offset of
    each needle."""

    tokens: np.ndarray
    depths: np.ndarray
    digits: int
    seed: int

    @property
    def keys(self) -> np.ndarray:
        """uint8 [T, digits]: the answers."""
        return self.tokens[:, -self.digits:]


def eval_set(length: int, *, trials: int, seed: int = 0, digits: int = 5) -> EvalSet:
    """`trials` passkey documents of `length` bytes, the same for every call with these
    arguments (and for every model evaluated on them)."""
    _check(length, digits)
    checks.positive_int("trials", trials)
    checks.integer("seed", seed, minimum=0)
    docs, depths = [], []
    for t in range(trials):
        doc = document(np.random.default_rng([_EVAL_STREAM, seed, length, t]), length,
                       digits=digits)
        docs.append(np.frombuffer(doc, dtype=np.uint8))
        depths.append(doc.index(NEEDLE_PREFIX))
    return EvalSet(tokens=np.stack(docs), depths=np.asarray(depths, dtype=np.int64),
                   digits=int(digits), seed=int(seed))

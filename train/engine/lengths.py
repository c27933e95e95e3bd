"""The length grammar of both studies: token counts written over a named base.

    length("L/2", base="L", value=64, what="eval length")        -> 32
    length("4C", base="C", value=8192, what="length")            -> 32768
    lengths("C/4,C,2C", base="C", value=8192, key="config.lengths") -> (2048, 8192, 16384)

A length is an int ('3000') or a multiple of the base: 'L', '4L', '2*L', 'L/2', '3L/4'. The
base is the study's reference length: L, the training length of the study of models trained
from scratch; C, the context length of a pretrained checkpoint. A fraction that is not a whole
number of tokens, a division by zero and a length under `minimum` are ValueErrors naming the
expression, where it came from and the base's value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def length(raw: Any, *, base: str, value: int, what: str = "length", where: str = "",
           minimum: int = 1) -> int:
    """One length expression -> a number of tokens >= `minimum`. Errors start with
    `what` and the expression, and add `where` (" in config.eval_lengths")."""
    text = str(raw).strip().replace(" ", "")
    found = re.fullmatch(rf"(\d*)\*?{re.escape(base)}(?:/(\d+))?", text)
    if found:
        mult, div = int(found.group(1) or 1), int(found.group(2) or 1)
        if div == 0:
            raise ValueError(f"{what} {text!r}{where} divides by zero")
        if (mult * value) % div:
            raise ValueError(f"{what} {text!r} is not a whole number of tokens for "
                             f"{base}={value}{where}")
        tokens = mult * value // div
    elif re.fullmatch(r"\d+", text):
        tokens = int(text)
    else:
        raise ValueError(f"{what} {raw!r} must be an int or '{base}', '2{base}', '{base}/4'"
                         f"{where}: a length must be a positive int or a multiple of {base} "
                         f"({base}={value})")
    if tokens < minimum:
        need = ("a positive number of tokens" if minimum == 1
                else f"at least {minimum} tokens")
        raise ValueError(f"{what} {raw!r} must be {need}, got {tokens}")
    return tokens


def lengths(spec: Any, *, base: str, value: int, key: str, what: str = "length",
            minimum: int = 1) -> tuple[int, ...]:
    """'L/2,L,2L,3000' (or a sequence) -> sorted distinct lengths; `key` (the config key as
    typed, 'config.eval_lengths') is named in every error, and none at all is an error."""
    if isinstance(spec, str):
        items = [p for p in spec.split(",") if p.strip()]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise TypeError(f"{key} must be a comma-separated string, got "
                        f"{type(spec).__name__}: {spec!r}")
    out = {length(raw, base=base, value=value, what=what, where=f" in {key}",
                  minimum=minimum) for raw in items}
    if not out:
        raise ValueError(f"{key}={spec!r} names no length")
    return tuple(sorted(out))

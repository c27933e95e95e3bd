"""Name lists in study configs: 'rope,alibi' -> ('rope', 'alibi'), each checked.

    names("rope,alibi", key="config.encodings", valid=posenc_jax.names())
    names("all", key="config.methods", valid=methods, allow_all=True)   -> every valid name
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def names(value: Any, *, key: str, valid: Sequence[str], allow_all: bool = False,
          required: bool = False) -> tuple[str, ...]:
    """A comma-separated string (or a list) of names from `valid`, none twice. `key` is the
    config key as typed ('config.finetune.scalings'); its singular names one entry in the
    messages ('unknown finetune.scaling ...'). 'all' (with `allow_all`) is every valid name;
    `required`: an empty list is an error."""
    valid = tuple(valid)
    singular = key.removeprefix("config.").removesuffix("s")
    if isinstance(value, str):
        if allow_all and value.strip() == "all":
            return valid
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        raise TypeError(f"{key} must be a comma-separated string, got "
                        f"{type(value).__name__}: {value!r}")
    choices = ", ".join(map(repr, valid)) + (" (or 'all')" if allow_all else "")
    unknown = [n for n in items if n not in valid]
    if unknown:
        raise ValueError(f"{key}={value!r}: unknown {unknown} (unknown {singular} "
                         f"{unknown[0]!r}; valid: {choices})")
    if len(set(items)) != len(items):
        raise ValueError(f"{key}={value!r} names an entry twice")
    if required and not items:
        raise ValueError(f"{key}={value!r} names no {singular}; valid: {choices}")
    return tuple(items)

"""Hashable forms of nested dicts (private): what lets configs and schemes be static under jit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class _FrozenDict(tuple):
    """A hashable dict: a sorted tuple of (key, frozen value) pairs."""

    __slots__ = ()

    def __repr__(self):
        return repr(thaw(self))


def freeze(value: Any) -> Any:
    """Dicts (and ConfigDicts) -> `_FrozenDict`, lists -> tuples, recursively: hashable."""
    if hasattr(value, "to_dict") and callable(value.to_dict):  # ml_collections.ConfigDict
        value = value.to_dict()
    if isinstance(value, _FrozenDict):
        return value
    if isinstance(value, Mapping):
        return _FrozenDict(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of `freeze`: `_FrozenDict` -> dict, tuples -> lists."""
    if isinstance(value, _FrozenDict):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value

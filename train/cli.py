"""Flag parsing shared by `python -m train` and `python -m train.study`.

`parse_flags` is an `absl.app.run(main, flags_parser=...)` parser that turns the two usual
command-line mistakes into one line on stderr (exit status 1) instead of a traceback:

* a config key that does not exist (`--config.mesh.contxt=4`, `--config.workers=2` on the
  training CLI): the line names the key as typed, the block it is missing from, close matches
  and the block's keys;
* a value of the wrong type (`--config.model.causal=Flase`): absl's message, on one line.

It also lets the command line set keys of the open mappings, those named `*kwargs`
(`--config.model.encoding_kwargs.max_len=16`, `--config.dataset.kwargs.max_files=8`): a locked
config refuses new keys, so these flags are set after the rest, a value read as a Python literal
(`16`, `0.5`, `'x'`, `(1, 2)`, `True`) or else kept as the string typed.
"""

from __future__ import annotations

import ast
import difflib
import sys
from collections.abc import Mapping, Sequence

from absl import flags
from ml_collections import config_flags

PREFIX = "--config."


def _is_open(parts: Sequence[str]) -> bool:
    """Whether a dotted key sets a key inside a `*kwargs` mapping."""
    return any(p.endswith("kwargs") for p in parts[:-1])


def _split(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """argv without the `--config.<...>kwargs.<key>=value` flags, and those as (key, value)."""
    rest, open_items = [], []
    for arg in argv:
        key, eq, value = arg[len(PREFIX):].partition("=")
        if arg.startswith(PREFIX) and eq and _is_open(key.split(".")):
            open_items.append((key, value))
        else:
            rest.append(arg)
    return rest, open_items


def _keys(node) -> list[str]:
    return sorted(node.keys()) if isinstance(node, Mapping) or hasattr(node, "keys") else []


def missing_key(config, key: str) -> str | None:
    """Why the dotted `key` does not name a key of `config` (one sentence), or None if it does.
    The last part may be new inside a `*kwargs` mapping."""
    node, path = config, "config"
    parts = key.split(".")
    for i, part in enumerate(parts):
        keys = _keys(node)
        if part in keys:
            node, path = node[part], f"{path}.{part}"
            continue
        if i == len(parts) - 1 and _is_open(parts):
            return None
        if not keys:
            return f"{path} is {type(node).__name__} {node!r}, not a block with keys"
        close = difflib.get_close_matches(part, keys, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        shown = ", ".join(keys[:40]) + (", ..." if len(keys) > 40 else "")
        return f"{path} has no key {part!r}{hint} ({path}'s keys: {shown})"
    return None


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _set_open(config, key: str, text: str) -> None:
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    value = _literal(text)
    if hasattr(node, "unlocked"):
        with node.unlocked():
            node[leaf] = value
    else:
        node[leaf] = value


def _config_keys(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(the flag as typed, its dotted key) for each `--config.<key>=...` flag."""
    out = []
    for arg in argv:
        if arg.startswith(PREFIX):
            out.append((arg.partition("=")[0], arg[len(PREFIX):].partition("=")[0]))
    return out


def _fail(message: str) -> None:
    sys.exit(f"error: {message}")


def _base_config(argv: Sequence[str]):
    """The config file's config, no overrides applied (None if none can be loaded)."""
    paths = [a.partition("=")[2] for a in argv if a.startswith("--config=")]
    if not paths:
        return None
    probe = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=probe)
    saved, sys.argv = sys.argv, [argv[0], f"--config={paths[-1]}"]
    try:  # config_flags reads its overrides from sys.argv
        probe(sys.argv)
        return probe["config"].value
    except Exception:  # noqa: BLE001 -- the caller reports the original error instead
        return None
    finally:
        sys.argv = saved


def parse_flags(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """Parses `argv` into `flag_values` (as absl's default parser does) and returns the
    arguments left; exits with one line on stderr for an unknown key or a bad value."""
    rest, open_items = _split(argv)
    saved, sys.argv = sys.argv, list(rest)
    try:  # config_flags reads the overrides from sys.argv, not from its argument
        left = flag_values(rest)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
        config = _base_config(rest)
        for typed, key in _config_keys(rest) if config is not None else ():
            why = missing_key(config, key)
            if why:
                _fail(f"{typed}: {why}")
        _fail(f"{type(err).__name__}: {err}".replace("\n", " "))
    finally:
        sys.argv = saved
    config = flag_values["config"].value if "config" in flag_values else None
    for key, text in open_items:
        why = missing_key(config, key) if config is not None else "no --config given"
        if why:
            _fail(f"{PREFIX}{key}: {why}")
        try:
            _set_open(config, key, text)
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            _fail(f"{PREFIX}{key}={text}: {type(err).__name__}: {err}")
    return left

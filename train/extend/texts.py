"""The long real texts of the extension study, taken from the Python that runs it.

    source_text(name) -> str               the whole text ("prose" or "code")
    document_ids(tokenizer, name, n, *, add_bos) -> list[int]   its first n tokens

Nothing is downloaded: both texts ship with every CPython, found with `sysconfig`.

* prose: `Lib/pydoc_data/topics.py`, the Python documentation's reference topics (757 KB in
  3.11), read as the strings it holds (`ast.literal_eval` of its `topics` dict, in the file's
  order), joined by blank lines: plain English prose, not a Python literal.
* code: long standard-library modules (`CODE_MODULES`) one after the other, as source.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from typing import Any

PROSE_FILE = os.path.join("pydoc_data", "topics.py")
CODE_MODULES = ("_pydecimal.py", "turtle.py", "inspect.py", "typing.py", "argparse.py",
                "subprocess.py", "tarfile.py", "pathlib.py")
TEXTS = ("prose", "code")
_CHARS_PER_TOKEN = 3  # a first guess of the characters needed; more are read when short


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose() -> str:
    """The documentation topics of `pydoc_data/topics.py` as plain text, in file order."""
    path = os.path.join(stdlib_dir(), PROSE_FILE)
    tree = ast.parse(_read(path), filename=path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return "\n\n".join(str(v).strip() for v in topics.values())
    raise ValueError(f"{path} has no `topics = {{...}}` dict")


def code() -> str:
    """The source of `CODE_MODULES` (those this Python has), one after the other."""
    root = stdlib_dir()
    parts = [_read(os.path.join(root, m)) for m in CODE_MODULES
             if os.path.exists(os.path.join(root, m))]
    if not parts:
        raise ValueError(f"none of {CODE_MODULES} is in {root}")
    return "\n\n".join(parts)


_SOURCES = {"prose": prose, "code": code}


def source_text(name: str) -> str:
    """The text called `name`; ValueError naming the valid ones."""
    if name not in _SOURCES:
        raise ValueError(f"unknown text {name!r}; valid: {', '.join(TEXTS)}")
    return _SOURCES[name]()


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """`tokenizer.encode(text)` without the BOS a tokenizer may add by itself (Gemma's does):
    the ids of the text alone, to concatenate pieces."""
    ids = [int(i) for i in tokenizer.encode(text)]
    bos = getattr(tokenizer, "bos_id", None)
    return ids[1:] if bos is not None and ids[:1] == [bos] else ids


def encode(tokenizer: Any, text: str, *, add_bos: bool) -> list[int]:
    """The ids of `text`, with `tokenizer.bos_id` in front exactly when `add_bos`."""
    ids = plain_ids(tokenizer, text)
    bos = getattr(tokenizer, "bos_id", None)
    return [int(bos)] + ids if add_bos and bos is not None else ids


def document_ids(tokenizer: Any, name: str, n: int, *, add_bos: bool,
                 text: str | None = None) -> list[int]:
    """The first `n` token ids of text `name` (or of `text`). Only a prefix of the text is
    tokenized (more when it was too short); ValueError when the whole text is shorter."""
    text = source_text(name) if text is None else text
    chars = max(1024, _CHARS_PER_TOKEN * n)
    while True:
        ids = encode(tokenizer, text[:chars], add_bos=add_bos)
        if len(ids) > n:  # > n: the last token of a cut prefix may be half a word
            return ids[:n]
        if chars >= len(text):
            raise ValueError(f"text {name!r} has {len(ids)} tokens, fewer than the {n} asked "
                             "for; use shorter lengths")
        chars *= 2

"""Every `--config.X=VALUE` flag README.md and docs/*.md show is parsed by the command line.

README documented `--config.model.context_mode=all_gather` while the CLI answered "config.model
has no key 'context_mode'" (issue 34). Here each documented flag goes through the parser the
commands use (`train.cli.parse_flags`, ml_collections' config flags) against the config file
that has its key: the key must exist and the value must parse to that key's type. A flag in
the docs that no config file has fails the suite. Placeholders are filled: N -> 2;
`--config.key=value` (the syntax, not a flag) is skipped.
"""

from __future__ import annotations

import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

from train import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"--config\.([A-Za-z0-9_.]+)=([^\s`'\"\\]+)")
PLACEHOLDERS = {"N": "2"}
SYNTAX = {("key", "value")}
# The config files a documented flag may belong to: the trainer's, the study's, the
# extension study's (each flag is tried against them in this order).
CONFIG_FILES = sorted((ROOT / "configs").glob("*.py"))


def documented() -> list[tuple[str, str, str]]:
    """(file name, dotted key, value) of every documented flag, once each."""
    seen, out = set(), []
    for doc in DOCS:
        for key, value in FLAG.findall(doc.read_text()):
            value = PLACEHOLDERS.get(value, value).rstrip(".,;:)")
            if (key, value) in SYNTAX or (key, value) in seen:
                continue
            seen.add((key, value))
            out.append((doc.name, key, value))
    return out


FLAGS = documented()


def _parse(*argv: str):
    """The config `argv` gives, through the commands' own parser (SystemExit on an error)."""
    probe = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=probe)
    cli.parse_flags(["prog", *argv], probe)
    return probe["config"].value


@pytest.fixture(scope="module")
def configs() -> dict[pathlib.Path, object]:
    """Each config file's config, loaded once (a file that does not load is left out)."""
    out = {}
    for path in CONFIG_FILES:
        try:
            out[path] = _parse(f"--config={path}")
        except SystemExit:
            continue
    assert ROOT / "configs" / "default.py" in out
    return out


def test_the_docs_show_flags_and_the_context_mode_among_them():
    keys = {key for _, key, _ in FLAGS}
    assert len(FLAGS) >= 15
    assert {"model.context_mode", "mesh.context", "model.attention"} <= keys


@pytest.mark.parametrize(("doc", "key", "value"), FLAGS,
                         ids=[f"{d}:{k}={v}" for d, k, v in FLAGS])
def test_documented_flag_parses(doc, key, value, configs):
    owner = next((p for p, c in configs.items() if cli.missing_key(c, key) is None), None)
    assert owner is not None, (f"{doc} documents --config.{key}={value}, but no file in "
                               f"configs/ has the key {key!r}")
    try:
        node = _parse(f"--config={owner}", f"--config.{key}={value}")
    except SystemExit as exit_:
        pytest.fail(f"{doc}: --config.{key}={value} with --config={owner.name}: {exit_.code}")
    for part in key.split("."):
        node = node[part]
    assert node is not None

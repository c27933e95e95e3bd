"""TFDS builders over a directory of files: the bundled stdlib corpus and a user's text files.

`python_stdlib` is the running interpreter's own standard library (`sysconfig` "stdlib"),
`.py` files only, without `site-packages`, the test folders (`test/`, `tests/`,
`idlelib/idle_test`, ...), `__pycache__`, the build folder `config-*` and the machine-specific
`_sysconfigdata*`. `text_dir` is any directory and glob pattern. Both store one example per file,
`{"text": bytes, "path": relative POSIX path}`, split by a hash of the path (`common.SPLIT_RULE`)
and ordered within a split by a second, salted hash of the path (deterministic and unrelated to
directory order). The corpus identity (file and byte counts, sha256 over the sorted paths and
contents, and for the stdlib the Python version) is stored as the dataset's metadata.

The builder config name is a fingerprint of the file list (paths, sizes, mtimes), so a changed
directory or another interpreter is prepared afresh instead of silently reusing old data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import platform
import re
import sysconfig
from typing import ClassVar

import tensorflow_datasets as tfds

from posenc_jax import checks
from train.datasets import common


class _QuietCustomConfig(logging.Filter):
    """Drops TFDS's per-construction notes about our (deliberately) custom configs."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("FileCorpusConfig(" in message
                    or (message.startswith("Variant folder")
                        and ("/python_stdlib/" in message or "/text_dir/" in message)))


@contextlib.contextmanager
def _quiet_custom_configs():
    """`_QuietCustomConfig` on absl's logger while TFDS builds our builders (only then: importing
    this module changes no logger)."""
    logger, quiet = logging.getLogger("absl"), _QuietCustomConfig()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)

_STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclasses.dataclass(eq=False)
class FileCorpusConfig(tfds.core.BuilderConfig):
    """Which files: `root` directory, glob `pattern` (relative to root), first `max_files`."""

    root: str = ""
    pattern: str = "**/*.py"
    max_files: int | None = None


def stdlib_root() -> str:
    """The running interpreter's standard-library directory."""
    return sysconfig.get_paths()["stdlib"]


def stdlib_files(root: str, *, max_files: int | None = None) -> list[str]:
    """Sorted relative POSIX paths of the stdlib's `.py` files (first `max_files` if given)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d not in _STDLIB_EXCLUDED_DIRS and not d.startswith("config-")]
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                found.append(pathlib.PurePath(rel).as_posix())
    return sorted(found)[:max_files]


def glob_files(root: str, pattern: str, *, max_files: int | None = None) -> list[str]:
    """Sorted relative POSIX paths of the regular files under `root` matching `pattern`."""
    base = pathlib.Path(root)
    found = {p.relative_to(base).as_posix() for p in base.glob(pattern) if p.is_file()}
    return sorted(found)[:max_files]


def _fingerprint(kind: str, root: str, pattern: str, files: list[str], max_files) -> str:
    stats = []
    for rel in files:
        info = os.stat(os.path.join(root, rel))
        stats.append((rel, info.st_size, info.st_mtime_ns))
    blob = json.dumps([kind, os.path.abspath(root), pattern, max_files, stats])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def content_identity(root: str, files: list[str]) -> dict:
    """Counts and a sha256 over the sorted files: per file `path \\0 size \\0 content`."""
    digest = hashlib.sha256()
    per_split = {s: {"num_files": 0, "num_bytes": 0} for s in common.SPLITS}
    total = 0
    for rel in sorted(files):
        data = pathlib.Path(root, rel).read_bytes()
        digest.update(rel.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0" + data)
        split = per_split[common.assign_split(rel)]
        split["num_files"] += 1
        split["num_bytes"] += len(data)
        total += len(data)
    return {"num_files": len(files), "num_bytes": total, "sha256": digest.hexdigest(),
            "splits": per_split, "split_rule": common.SPLIT_RULE,
            "checksum_rule": "sha256 over sorted files of: path, NUL, decimal size, NUL, bytes"}


class _FileCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """One example per file: {"text": the file's bytes, "path": its relative POSIX path}."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "First release."}
    KIND = ""

    def list_files(self) -> list[str]:
        raise NotImplementedError

    def identity_extra(self) -> dict:
        return {}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(f"{self.KIND}: files under {self.builder_config.root!r} matching "
                         f"{self.builder_config.pattern!r}, as bytes. Corpus identity (file "
                         "count, byte count, sha256) is in the metadata (metadata.json)."),
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "path": tfds.features.Text()}),
            metadata=tfds.core.MetadataDict(),
            disable_shuffling=True,  # keep our own hash order, independent of the TFDS version
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        files = self.list_files()
        root = self.builder_config.root
        identity = {"name": self.KIND, "root": root, "pattern": self.builder_config.pattern,
                    "max_files": self.builder_config.max_files, **self.identity_extra(),
                    **content_identity(root, files)}
        self.info.metadata.update(identity)
        by_split = {s: [] for s in common.SPLITS}
        for rel in files:
            by_split[common.assign_split(rel)].append(rel)
        return {s: self._generate_examples(sorted(fs, key=_order_key))
                for s, fs in by_split.items()}

    def _generate_examples(self, files):
        for rel in files:
            yield rel, {"text": pathlib.Path(self.builder_config.root, rel).read_bytes(),
                        "path": rel}


def _order_key(relpath: str) -> float:
    return common.hash_unit(relpath, salt="order:")


class PythonStdlib(_FileCorpus):
    """The running interpreter's standard library `.py` files (the bundled default corpus)."""

    KIND = "python_stdlib"

    def list_files(self) -> list[str]:
        return stdlib_files(self.builder_config.root, max_files=self.builder_config.max_files)

    def identity_extra(self) -> dict:
        return {"python_version": platform.python_version(),
                "python_implementation": platform.python_implementation()}


class TextDir(_FileCorpus):
    """A user's directory of text files selected by a glob pattern."""

    KIND = "text_dir"

    def list_files(self) -> list[str]:
        cfg = self.builder_config
        return glob_files(cfg.root, cfg.pattern, max_files=cfg.max_files)


def _check_max_files(max_files):
    if max_files is not None:
        checks.positive_int("max_files", max_files)


def stdlib_builder(data_dir=None, *, max_files: int | None = None) -> PythonStdlib:
    """A `PythonStdlib` builder (not prepared) for this interpreter under `data_dir`."""
    _check_max_files(max_files)
    root = stdlib_root()
    files = stdlib_files(root, max_files=max_files)
    version = platform.python_version().replace(".", "_")
    name = f"py{version}_{_fingerprint('python_stdlib', root, '*.py', files, max_files)}"
    config = FileCorpusConfig(name=name, root=root, pattern="*.py", max_files=max_files,
                              description=f"Python {platform.python_version()} stdlib")
    return PythonStdlib(config=config, data_dir=common.resolve_data_dir(data_dir))


def text_dir_builder(path=None, data_dir=None, *, pattern: str = "**/*.txt",
                     max_files: int | None = None) -> TextDir:
    """A `TextDir` builder (not prepared) for files under `path` matching `pattern`."""
    _check_max_files(max_files)
    if path is None:
        raise ValueError("text_dir needs path=<directory of text files>, got path=None")
    root = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isdir(root):
        raise ValueError(f"text_dir path={root!r} is not an existing directory")
    files = glob_files(root, pattern, max_files=max_files)
    if not files:
        raise ValueError(f"text_dir found no files matching pattern={pattern!r} under {root!r}")
    stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.basename(root)).strip("_")[:40] or "root"
    name = f"{stem}_{_fingerprint('text_dir', root, pattern, files, max_files)}"
    config = FileCorpusConfig(name=name, root=root, pattern=pattern, max_files=max_files,
                              description=f"text files {pattern!r} under {root!r}")
    return TextDir(config=config, data_dir=common.resolve_data_dir(data_dir))


def prepared(builder_fn, *args, **kwargs):
    """`builder_fn(*args, **kwargs)` prepared once (lazily, under a file lock), ready to read."""
    with _quiet_custom_configs():
        return common.prepare_once(lambda: builder_fn(*args, **kwargs))

"""Shared pieces: data directories, the split-by-hash rule, bytes as tokens, prepare-once.

A document is a 1-D uint8 numpy array of bytes (vocabulary 256, no tokenizer).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SPLITS = ("train", "validation", "test")
# Cumulative upper bounds of the split buckets: [0, .90) train, [.90, .95) validation, rest test.
_SPLIT_BOUNDS = (0.90, 0.95, 1.0)
SPLIT_RULE = (
    "split by file: u = first 8 bytes of sha256(relative POSIX path, utf-8) as a big-endian "
    "integer / 2**64; train if u < 0.90, validation if u < 0.95, else test"
)
DATA_DIR_ENV = "POSENC_DATA_DIR"


def default_data_dir() -> str:
    """Where built-in datasets are prepared: $POSENC_DATA_DIR or ~/.cache/posenc_jax/tfds."""
    return os.environ.get(DATA_DIR_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "posenc_jax", "tfds")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
    """`data_dir` as an absolute path string; None means `default_data_dir()`."""
    path = default_data_dir() if data_dir is None else os.fspath(data_dir)
    return os.path.abspath(os.path.expanduser(path))


def hash_unit(text: str, *, salt: str = "") -> float:
    """A stable number in [0, 1) from sha256(salt + text): same on every machine and run."""
    digest = hashlib.sha256((salt + text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(relpath: str) -> str:
    """The split ('train' | 'validation' | 'test') of a file, from its relative POSIX path only.

    Depends on nothing but the path string (not on file order, content or which other files
    exist), so adding or removing files never moves another file between splits.
    """
    u = hash_unit(relpath)
    for split, bound in zip(SPLITS, _SPLIT_BOUNDS):
        if u < bound:
            return split
    return SPLITS[-1]


def to_byte_tokens(value: Any) -> np.ndarray:
    """A text value (bytes, str, numpy bytes/str scalar or 1-D uint8 array) -> uint8 [N]."""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        if value.ndim != 1:
            raise ValueError(f"a byte document must be 1-D, got shape {value.shape}")
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"a text feature must be bytes or str, got {type(value).__name__}: {value!r:.80}")
    return np.frombuffer(bytes(value), dtype=np.uint8)


class ByteDocuments(Sequence):
    """A random-access view of a record source as byte documents.

    `docs[i]` -> uint8 [N_i], the bytes of record i's `text_key` feature. `len(docs)` is the
    number of records. Works over any `__len__`/`__getitem__` source of dict records (TFDS
    `ArrayRecordDataSource`, a list), so it plugs into `grain.MapDataset.source`.
    """

    def __init__(self, records: Sequence, *, text_key: str = "text", identity: dict | None = None):
        self.records = records
        self.text_key = text_key
        self.identity = dict(identity or {})

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        if not -len(self) <= index < len(self):
            raise IndexError(f"document index {index} out of range for {len(self)} documents")
        record = self.records[int(index) % len(self)]
        if self.text_key not in record:
            raise ValueError(
                f"text_key={self.text_key!r} is not a feature of this dataset; "
                f"its features are {sorted(record)}")
        return to_byte_tokens(record[self.text_key])

    def __repr__(self) -> str:
        return f"ByteDocuments({len(self)} documents, text_key={self.text_key!r})"


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive inter-process lock on `path` (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_once(make_builder: Callable[[], Any]):
    """Prepare `make_builder()` as array_record unless done already; returns a ready builder.

    Several processes sharing a data_dir (e.g. two local hosts) serialise on a file lock next
    to the data, and whoever comes second finds it prepared. No network: GCS look-ups are off.
    """
    import tensorflow_datasets as tfds

    builder = make_builder()
    if builder.is_prepared():
        return builder
    lock = os.path.join(os.fspath(builder.data_dir_root),
                        f".{builder.name}-{builder.builder_config.name}.lock")
    with _file_lock(lock):
        builder = make_builder()
        if not builder.is_prepared():
            builder.download_and_prepare(
                file_format="array_record",
                download_config=tfds.download.DownloadConfig(try_download_gcs=False),
            )
    return make_builder()  # re-read: info, splits and metadata from disk

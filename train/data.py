"""Data for training and evaluation: byte-level documents, one token stream per split, batches.

Shape letters: B the global batch size, B_local = B / process_count the rows one process
loads, L the sequence length, N the tokens in a stream, D the documents in it.

Sources (`get_source`), each split a random-access sequence of documents (uint8 [N_i]):
  "python_stdlib"  the running interpreter's standard library, the bundled default corpus (a
                   TFDS builder prepared lazily, once, as array_record under data_dir);
                   kwarg `max_files` takes the first files by path (tests).
  "text_dir"       a user's directory of text files: `path=`, `pattern="**/*.txt"`.
  "copy", "passkey", "assoc_recall"   synthetic tasks: `seed`, `num_examples`, `min_len`,
                   `max_len` (see `train.datasets.synthetic`); nothing is stored.
  any other name   a TFDS text dataset already prepared (array_record) in data_dir; the text
                   feature is `text_key`.
Built-in datasets live under data_dir (default $POSENC_DATA_DIR or ~/.cache/posenc_jax/tfds);
for TFDS names data_dir=None means TFDS's default ($TFDS_DATA_DIR or ~/tensorflow_datasets).

A pretrained model reads the same sources through its own tokenizer (`config_stream(...,
tokenizer=...)`, `train.datasets.tokenized`): the stream then holds int32 token ids, documents
joined by EOS (`dataset.eos_join`) or, with `packed`, kept apart by segment ids.

Batches are dicts of numpy arrays, the same for every reader:
  inputs int32 [B_local, L]       tokens t[o : o+L] of a window starting at o
  targets int32 [B_local, L]      the next tokens t[o+1 : o+L+1]
  positions int32 [B_local, L]    arange(L); packed: restart at 0 at each document start
  segment_ids int32 [B_local, L]  1; packed: 1, 2, ... changing at each document start
  weights float32 [B_local, L]    1 for a scored target, 0 for padding (and, when packed, for a
                                  target that starts a new document: it has no context)

Two ways to read training data:
  `train_batch(stream, step=...)`  what the trainer uses: a pure function of (seed, step, row),
      windows at random offsets of the split's token stream, so a run resumed at step N sees
      exactly the batches of an uninterrupted run, and each process computes only its rows.
  `grain_dataset(source, ...)`  a grain `MapDataset` of random crops of shuffled documents, one
      document per row; also indexable by step (`ds[step]`), hence also resumable.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Sequence

import numpy as np

from posenc_jax import checks
from train.datasets import common, file_corpus, synthetic, tfds_text, tokenized

BUILTIN_NAMES = ("python_stdlib", "text_dir", *synthetic.TASKS)


def get_source(name: str, split: str, *, data_dir=None, text_key: str = "text",
               **builder_kwargs) -> Sequence[np.ndarray]:
    """The documents of `split` of dataset `name`; `source[i]` -> uint8 [N_i].

    The returned sequence has `len()` and random access and an `identity` dict (what it is,
    for reports). File corpora accept TFDS split slicing ("train[:10%]").
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"dataset name must be a non-empty string, got {name!r}")
    if name in synthetic.TASKS:
        return synthetic.SyntheticTask(name, split, **builder_kwargs)
    if name in ("python_stdlib", "text_dir"):
        make = file_corpus.stdlib_builder if name == "python_stdlib" else \
            file_corpus.text_dir_builder
        builder = file_corpus.prepared(make, data_dir=data_dir, **builder_kwargs)
        splits = sorted(builder.info.splits.keys())
        if split.split("[")[0] not in splits:
            raise ValueError(f"dataset {name!r} has splits {splits}, got split={split!r}")
        identity = {**dict(builder.info.metadata), "split": split,
                    "data_dir": os.fspath(builder.data_dir)}
        if builder.info.splits[split.split("[")[0]].num_examples == 0:
            return common.ByteDocuments([], identity=identity)  # a tiny corpus's empty split
        return common.ByteDocuments(builder.as_data_source(split=split), identity=identity)
    if builder_kwargs:
        raise ValueError(f"TFDS dataset {name!r} takes no builder kwargs here, got "
                         f"{sorted(builder_kwargs)} (built-in names: {list(BUILTIN_NAMES)})")
    return tfds_text.tfds_documents(name, split, data_dir=data_dir, text_key=text_key,
                                    builtin_names=BUILTIN_NAMES)


def corpus_identity(data_dir=None, *, name: str = "python_stdlib", split: str = "train",
                    **builder_kwargs) -> dict:
    """What a corpus is, as a JSON-able dict (prepares it if needed).

    For "python_stdlib": name, python_version, python_implementation, root, num_files,
    num_bytes, sha256 (over the sorted paths and contents), per-split counts, the split rule.
    """
    source = get_source(name, split, data_dir=data_dir, **builder_kwargs)
    identity = dict(source.identity)
    if name in ("python_stdlib", "text_dir"):
        identity.pop("split", None)  # the whole corpus, with per-split counts in "splits"
    return json.loads(json.dumps(identity, default=str))


@dataclasses.dataclass(frozen=True, eq=False)
class TokenStream:
    """A split's documents concatenated: `tokens` uint8 [N], `doc_starts` int64 [D].

    `doc_starts` is strictly increasing from 0 (empty documents are dropped): document d is
    `tokens[doc_starts[d] : doc_starts[d+1]]`. Bytes stay uint8 in memory (a quarter of int32);
    batches hand them out as int32.
    """

    tokens: np.ndarray
    doc_starts: np.ndarray
    identity: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_documents(cls, documents: Sequence[np.ndarray], *, max_tokens: int | None = None,
                       identity: dict | None = None) -> TokenStream:
        """Concatenate `documents` in order, stopping once `max_tokens` are reached (if given).
        Documents that come `iter_batches()` (tokenized ones) are read that way."""
        parts, total = [], 0
        docs = documents.iter_batches() if hasattr(documents, "iter_batches") else (
            documents[i] for i in range(len(documents)))
        for doc in docs:
            if max_tokens is not None and total >= max_tokens:
                break
            doc = np.asarray(doc)
            if doc.size:
                parts.append(doc)
                total += doc.size
        if not parts:
            raise ValueError(f"no tokens: the {len(documents)} documents are all empty")
        tokens = np.concatenate(parts)
        if max_tokens is not None:
            tokens = tokens[:max_tokens]
        starts = np.cumsum([0] + [p.size for p in parts[:-1]], dtype=np.int64)
        starts = starts[starts < tokens.size]
        return cls(tokens=tokens, doc_starts=starts, identity=dict(identity or {}))

    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts.size)


def token_stream(name: str, split: str, *, data_dir=None, text_key: str = "text",
                 max_tokens: int | None = None, **builder_kwargs) -> TokenStream:
    """`TokenStream` of `get_source(name, split, ...)`, read anew on every call (a
    `train.runtime.Runtime` keeps streams for reuse).

    `max_tokens` caps the stream (use it for large TFDS sets; the stdlib corpus is ~12 MB).
    """
    source = get_source(name, split, data_dir=data_dir, text_key=text_key, **builder_kwargs)
    return TokenStream.from_documents(source, max_tokens=max_tokens,
                                      identity=getattr(source, "identity", {}))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 (a bijection with good avalanche)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def window_offsets(*, seed: int, step: int, rows: np.ndarray, num_offsets: int) -> np.ndarray:
    """int64 [len(rows)]: a counter-based draw in [0, num_offsets) for each (seed, step, row)."""
    checks.integer("seed", seed, minimum=0, maximum=2**63 - 1)
    checks.integer("step", step, minimum=0, maximum=2**63 - 1)
    h = _mix64(np.full(rows.shape, seed, dtype=np.uint64))
    h = _mix64(h ^ np.uint64(step))
    h = _mix64(h ^ rows.astype(np.uint64))
    return (h % np.uint64(num_offsets)).astype(np.int64)


def _check_rows(batch_size: int, process_index: int, process_count: int) -> np.ndarray:
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("process_count", process_count)
    checks.integer("process_index", process_index, minimum=0, maximum=process_count - 1)
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} must be divisible by process_count="
                         f"{process_count} (each process loads batch_size/process_count rows)")
    local = batch_size // process_count
    return np.arange(process_index * local, (process_index + 1) * local, dtype=np.int64)


def _windows(stream: TokenStream, starts: np.ndarray, *, seq_len: int, packed: bool,
             limit: int | None = None) -> dict[str, np.ndarray]:
    """The batch dict for windows starting at `starts` int64 [B]; inputs at index >= limit
    are padding (weight 0)."""
    idx = starts[:, None] + np.arange(seq_len + 1, dtype=np.int64)[None, :]  # [B, L+1]
    safe = np.minimum(idx, len(stream) - 1)
    tokens = stream.tokens[safe].astype(np.int32)
    batch_rows = starts.shape[0]
    weights = np.ones((batch_rows, seq_len), dtype=np.float32)
    if limit is not None:
        weights *= idx[:, :-1] < limit
    if packed:
        doc = np.searchsorted(stream.doc_starts, safe, side="right") - 1  # [B, L+1]
        doc_in = doc[:, :-1]
        segment_ids = (doc_in - doc_in[:, :1] + 1).astype(np.int32)
        segment_start = np.maximum(stream.doc_starts[doc_in], starts[:, None])
        positions = (idx[:, :-1] - segment_start).astype(np.int32)
        weights *= doc[:, 1:] == doc_in
    else:
        positions = np.broadcast_to(np.arange(seq_len, dtype=np.int32)[None, :],
                                    (batch_rows, seq_len)).copy()
        segment_ids = np.ones((batch_rows, seq_len), dtype=np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "positions": positions,
            "segment_ids": segment_ids, "weights": weights}


def config_stream(dataset, split: str, *, tokenizer=None) -> TokenStream:
    """The token stream of `split` for a `config.dataset` block (name, data_dir, max_tokens,
    kwargs, eos_join): the one place the trainer and the study turn a dataset config into
    data. With a `tokenizer` (a pretrained checkpoint's), the documents' text is read through
    it (`train.datasets.tokenized`; `eos_join` appends EOS to each document) instead of as
    bytes."""
    if tokenizer is None:
        return token_stream(dataset.name, split, data_dir=dataset.data_dir,
                            max_tokens=dataset.get("max_tokens"), **dataset.kwargs.to_dict())
    source = get_source(dataset.name, split, data_dir=dataset.data_dir,
                        **dataset.kwargs.to_dict())
    docs = tokenized.TokenizedDocuments(source, tokenizer,
                                        eos_join=bool(dataset.get("eos_join", False)))
    return TokenStream.from_documents(docs, max_tokens=dataset.get("max_tokens"),
                                      identity=docs.identity)


def train_batch(stream: TokenStream, *, step: int, batch_size: int, seq_len: int, seed: int,
                process_index: int = 0, process_count: int = 1,
                packed: bool = False) -> dict[str, np.ndarray]:
    """Rows process_index*B_local .. of the global training batch of `step` ([B_local, L] each).

    Row r of step s starts at a uniform offset in [0, N - L - 1] given by a counter-based hash of
    (seed, s, r): no state, no epochs (windows are drawn with replacement), the same on every
    process and run; which other steps or rows were drawn never matters.
    """
    checks.positive_int("seq_len", seq_len)
    if len(stream) < seq_len + 1:
        raise ValueError(f"the stream has {len(stream)} tokens, fewer than seq_len+1="
                         f"{seq_len + 1} needed for one window")
    rows = _check_rows(batch_size, process_index, process_count)
    starts = window_offsets(seed=seed, step=step, rows=rows, num_offsets=len(stream) - seq_len)
    return _windows(stream, starts, seq_len=seq_len, packed=packed)


def eval_batches(stream: TokenStream, *, seq_len: int, num_tokens: int, batch_size: int,
                 packed: bool = False, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Non-overlapping windows scoring exactly the targets tokens[1 : num_tokens+1].

    Window w has inputs tokens[w*L : (w+1)*L]; there are ceil(num_tokens / L) of them, so every
    seq_len scores the same `num_tokens` targets (packed: minus those that start a document,
    the same ones for every L). The remainder: the last window's inputs past num_tokens are
    padding with weight 0, and the last batch is filled with all-zero-weight rows, so every
    batch is [B_local, L] and sum(weights) is independent of L and batch_size. Each window
    starts with no context (standard non-overlapping evaluation).
    """
    checks.positive_int("seq_len", seq_len)
    checks.integer("num_tokens", num_tokens, minimum=1, maximum=len(stream) - 1)
    rows = _check_rows(batch_size, process_index, process_count)
    num_windows = math.ceil(num_tokens / seq_len)
    for first in range(0, num_windows, batch_size):
        window = first + rows
        starts = np.where(window < num_windows, window * seq_len, num_tokens).astype(np.int64)
        yield _windows(stream, starts, seq_len=seq_len, packed=packed, limit=num_tokens)


def num_eval_batches(*, seq_len: int, num_tokens: int, batch_size: int) -> int:
    """How many batches `eval_batches` yields."""
    return math.ceil(math.ceil(num_tokens / seq_len) / batch_size)


def grain_dataset(source: Sequence[np.ndarray], *, seq_len: int, batch_size: int, seed: int,
                  num_epochs: int | None = None, process_index: int = 0,
                  process_count: int = 1):
    """A `grain.MapDataset` of batches ([B_local, L] dicts as above), one document per row.

    Documents are shuffled (reshuffled each epoch; `num_epochs=None` repeats forever), each
    cropped at a random offset to L+1 tokens or zero-padded (weights 0, segment_ids 0 on
    padding). `ds[step]` is the batch of `step`; process p holds rows p*B_local .. of it.
    """
    import grain

    _check_rows(batch_size, process_index, process_count)
    checks.positive_int("seq_len", seq_len)

    def crop(doc: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        doc = np.asarray(doc)
        window = np.zeros(seq_len + 1, dtype=np.int32)
        start = int(rng.integers(0, doc.size - seq_len)) if doc.size > seq_len + 1 else 0
        piece = doc[start:start + seq_len + 1]
        window[:piece.size] = piece
        real = np.arange(seq_len) < piece.size
        return {"inputs": window[:-1], "targets": window[1:],
                "positions": np.arange(seq_len, dtype=np.int32),
                "segment_ids": real.astype(np.int32),
                "weights": (np.arange(seq_len) < piece.size - 1).astype(np.float32)}

    elements = (grain.MapDataset.source(source).shuffle(seed=seed).repeat(num_epochs)
                .random_map(crop, seed=seed))
    local = batch_size // process_count
    if process_count > 1:  # local element j -> global element (step, this process's row)
        everything = elements
        elements = grain.MapDataset.range(len(everything) // batch_size * local).map(
            lambda j: everything[j // local * batch_size + process_index * local + j % local])
    return elements.batch(local, drop_remainder=True)

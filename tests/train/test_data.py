"""Tests for train.data: corpora, splits, token streams, step-indexed and eval batches, errors.

The stdlib corpus is prepared once per module into a tmp dir (about 1 s here).
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import tensorflow_datasets as tfds

from train import data
from train.datasets import common, file_corpus, synthetic


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A private data dir; POSENC_DATA_DIR points there too, so nothing touches ~/.cache."""
    path = tmp_path_factory.mktemp("tfds")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(common.DATA_DIR_ENV, str(path))
        yield str(path)


@pytest.fixture(scope="module")
def stdlib_records(data_dir):
    """{split: [(path, bytes), ...]} of the whole prepared stdlib corpus, in stored order."""
    builder = file_corpus.prepared(file_corpus.stdlib_builder, data_dir)
    return {split: [(ex["path"].decode(), ex["text"]) for ex in builder.as_data_source(split)]
            for split in common.SPLITS}


@pytest.fixture(scope="module")
def valid_stream(data_dir):
    return data.token_stream("python_stdlib", "validation", data_dir=data_dir)


def _stream(doc_lengths, seed=0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 256, size=n, dtype=np.uint8) for n in doc_lengths]
    return data.TokenStream.from_documents(docs)


# ---------------------------------------------------------------- the stdlib corpus and splits

def test_stdlib_splits_are_disjoint_cover_the_corpus_and_follow_the_path_hash(stdlib_records):
    paths = {s: [p for p, _ in recs] for s, recs in stdlib_records.items()}
    sets = {s: set(ps) for s, ps in paths.items()}
    assert not (sets["train"] & sets["validation"] or sets["train"] & sets["test"]
                or sets["validation"] & sets["test"])
    root = file_corpus.stdlib_root()
    assert set().union(*sets.values()) == set(file_corpus.stdlib_files(root))
    for split, ps in paths.items():
        assert all(common.assign_split(p) == split for p in ps)
        # stored order is the salted hash order, not directory order
        assert ps == sorted(ps, key=lambda p: common.hash_unit(p, salt="order:"))
    n = sum(len(v) for v in sets.values())
    assert 0.85 < len(sets["train"]) / n < 0.95 and len(sets["validation"]) >= 10
    assert not any("site-packages" in p or "/test/" in f"/{p}" or "/tests/" in f"/{p}"
                   or "idle_test" in p for p in sets["train"])
    assert "os.py" in set().union(*sets.values())


def test_assign_split_golden_and_independent_of_order():
    # golden values of the documented rule, from an independent computation here
    def rule(p):
        u = int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "big") / 2**64
        return "train" if u < 0.9 else "validation" if u < 0.95 else "test"

    paths = [f"pkg{i}/mod{i * 7 % 13}.py" for i in range(300)]
    first = {p: common.assign_split(p) for p in paths}
    second = {p: common.assign_split(p) for p in reversed(paths)}
    assert first == second == {p: rule(p) for p in paths}
    assert set(first.values()) == set(common.SPLITS)


def test_assign_split_is_the_same_in_another_process_with_another_hash_seed():
    golden = {"os.py": "train", "asyncio/tasks.py": "train", "_weakrefset.py": "validation",
              "asyncio/base_subprocess.py": "validation", "asyncio/base_events.py": "test",
              "asyncio/streams.py": "test"}
    assert {p: common.assign_split(p) for p in golden} == golden
    code = ("import json, sys; from train.datasets import common; "
            "print(json.dumps({p: common.assign_split(p) for p in json.loads(sys.argv[1])}))")
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(list(golden))], env=env,
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == golden


def test_corpus_identity_fields_and_checksum(data_dir, stdlib_records):
    ident = data.corpus_identity(data_dir)
    for key in ("python_version", "python_implementation", "num_files", "num_bytes", "sha256",
                "splits", "split_rule", "root"):
        assert key in ident, key
    import platform
    assert ident["python_version"] == platform.python_version()
    records = sorted(r for recs in stdlib_records.values() for r in recs)
    assert ident["num_files"] == len(records) > 500
    assert ident["num_bytes"] == sum(len(b) for _, b in records)
    assert sum(s["num_bytes"] for s in ident["splits"].values()) == ident["num_bytes"]
    digest = hashlib.sha256()
    for path, content in records:  # the documented checksum, recomputed independently
        digest.update(path.encode() + b"\0" + str(len(content)).encode() + b"\0" + content)
    assert ident["sha256"] == digest.hexdigest()


def test_prepared_once_second_call_reads_from_disk(data_dir, stdlib_records, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("prepared twice")

    monkeypatch.setattr(file_corpus.PythonStdlib, "download_and_prepare", refuse)
    source = data.get_source("python_stdlib", "test", data_dir=data_dir)
    assert len(source) == len(stdlib_records["test"])
    assert bytes(source[0]) == stdlib_records["test"][0][1]
    assert source[0].dtype == np.uint8


def test_subset_prepares_elsewhere_with_the_same_assignment(tmp_path, data_dir,
                                                            stdlib_records):
    a = data.get_source("python_stdlib", "train", data_dir=tmp_path / "a", max_files=40)
    b = data.get_source("python_stdlib", "train", data_dir=tmp_path / "b", max_files=40)
    assert a.identity["sha256"] == b.identity["sha256"] != data.corpus_identity(data_dir)[
        "sha256"]
    assert a.identity["num_files"] == 40
    assert [bytes(x) for x in a] == [bytes(x) for x in b]
    full_train = {p for p, _ in stdlib_records["train"]}
    subset = file_corpus.stdlib_files(file_corpus.stdlib_root())[:40]
    assert len(a) == len([p for p in subset if p in full_train])


def test_text_dir_split_rule_independent_of_creation_order(tmp_path):
    names = [f"d{i % 3}/note_{i}.txt" for i in range(40)]
    for order, root in ((names, tmp_path / "one"), (names[::-1], tmp_path / "two")):
        for name in order:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(f"document {name}\n" * 3)
        (root / "skip.md").write_text("not matched")
    got = {}
    for root in ("one", "two"):
        got[root] = {s: data.get_source("text_dir", s, data_dir=tmp_path / "tfds",
                                        path=tmp_path / root) for s in common.SPLITS}
    for split in common.SPLITS:
        texts = [bytes(d) for d in got["one"][split]]
        assert texts == [bytes(d) for d in got["two"][split]]
        assert all(common.assign_split(t.split(b" ")[1].split(b"\n")[0].decode()) == split
                   for t in texts)
    assert sum(len(got["one"][s]) for s in common.SPLITS) == 40


# ---------------------------------------------------------------- token streams and batches

def test_token_stream_concatenates_in_order_and_drops_empty_documents():
    docs = [np.frombuffer(b, np.uint8) for b in (b"ab", b"", b"cde", b"f")]
    s = data.TokenStream.from_documents(docs)
    assert bytes(s.tokens) == b"abcdef" and list(s.doc_starts) == [0, 2, 5]
    capped = data.TokenStream.from_documents(docs, max_tokens=4)
    assert bytes(capped.tokens) == b"abcd" and list(capped.doc_starts) == [0, 2]


def test_train_batch_is_a_pure_function_of_seed_step_and_row(valid_stream):
    kw = {"batch_size": 8, "seq_len": 64, "seed": 3}
    in_order = [data.train_batch(valid_stream, step=s, **kw) for s in range(6)]
    alone = data.train_batch(valid_stream, step=4, **kw)
    for key in alone:
        np.testing.assert_array_equal(alone[key], in_order[4][key])
    smaller = data.train_batch(valid_stream, step=4, **{**kw, "batch_size": 4})
    np.testing.assert_array_equal(smaller["inputs"], alone["inputs"][:4])
    assert not np.array_equal(in_order[3]["inputs"], in_order[4]["inputs"])
    other_seed = data.train_batch(valid_stream, step=4, **{**kw, "seed": 4})
    assert not np.array_equal(other_seed["inputs"], alone["inputs"])
    # each row is a true window of the stream: find it and check inputs/targets
    tokens = valid_stream.tokens.astype(np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, 65)
    for row in range(8):
        window = np.r_[alone["inputs"][row], alone["targets"][row][-1:]]
        assert (windows == window[None, :]).all(axis=1).any(), row
        np.testing.assert_array_equal(alone["targets"][row][:-1], alone["inputs"][row][1:])
    assert alone["inputs"].dtype == np.int32 and alone["weights"].dtype == np.float32
    np.testing.assert_array_equal(alone["positions"], np.tile(np.arange(64), (8, 1)))
    assert (alone["segment_ids"] == 1).all() and (alone["weights"] == 1).all()


@hypothesis.given(process_count=st.sampled_from([1, 2, 4, 8]), packed=st.booleans(),
                  step=st.integers(0, 10**9), seed=st.integers(0, 2**40))
def test_process_shares_concatenate_to_the_single_process_batch(process_count, packed, step,
                                                                seed):
    stream = _stream([50, 3, 120, 7, 1, 300, 64], seed=1)
    kw = {"step": step, "batch_size": 8, "seq_len": 16, "seed": seed, "packed": packed}
    whole = data.train_batch(stream, **kw)
    shares = [data.train_batch(stream, process_index=p, process_count=process_count, **kw)
              for p in range(process_count)]
    for key, value in whole.items():
        assert value.shape == (8, 16)
        np.testing.assert_array_equal(np.concatenate([s[key] for s in shares]), value)


def _packed_reference(doc_lengths, start, seq_len):
    """Positions, segment ids and weights of one window, by walking it in plain Python."""
    doc_of = [d for d, n in enumerate(doc_lengths) for _ in range(n)]
    positions, segments, weights = [], [], []
    pos, seg = 0, 1
    for i in range(start, start + seq_len):
        if i > start and doc_of[i] != doc_of[i - 1]:
            pos, seg = 0, seg + 1
        positions.append(pos)
        segments.append(seg)
        weights.append(float(doc_of[i + 1] == doc_of[i]))
        pos += 1
    return positions, segments, weights


def test_packed_golden_window():
    stream = _stream([3, 5, 1, 7])  # document starts 0, 3, 8, 9
    batch = data._windows(stream, np.array([2]), seq_len=8, packed=True)
    assert batch["positions"].tolist() == [[0, 0, 1, 2, 3, 4, 0, 0]]
    assert batch["segment_ids"].tolist() == [[1, 2, 2, 2, 2, 2, 3, 4]]
    assert batch["weights"].tolist() == [[0, 1, 1, 1, 1, 0, 0, 1]]


@hypothesis.given(lengths=st.lists(st.integers(1, 20), min_size=2, max_size=12),
                  step=st.integers(0, 1000))
def test_packed_positions_and_segments_restart_at_document_boundaries(lengths, step):
    hypothesis.assume(sum(lengths) > 9)
    stream = _stream(lengths)
    batch = data.train_batch(stream, step=step, batch_size=4, seq_len=8, seed=0, packed=True)
    tokens = stream.tokens.astype(np.int32)
    for row in range(4):
        starts = [o for o in range(len(tokens) - 8)
                  if np.array_equal(tokens[o:o + 9], np.r_[batch["inputs"][row],
                                                           batch["targets"][row][-1:]])]
        refs = [_packed_reference(lengths, o, 8) for o in starts]
        got = (batch["positions"][row].tolist(), batch["segment_ids"][row].tolist(),
               batch["weights"][row].tolist())
        assert got in refs


@pytest.mark.parametrize("packed", [False, True])
def test_eval_windows_score_the_same_tokens_for_every_seq_len(valid_stream, packed):
    num_tokens = 5000  # not a multiple of either length: exercises the remainder
    scored = {}
    for seq_len, batch_size in ((64, 8), (256, 3)):
        targets, inputs_at = [], []
        batches = list(data.eval_batches(valid_stream, seq_len=seq_len, num_tokens=num_tokens,
                                         batch_size=batch_size, packed=packed))
        assert len(batches) == data.num_eval_batches(seq_len=seq_len, num_tokens=num_tokens,
                                                     batch_size=batch_size)
        for batch in batches:
            assert batch["inputs"].shape == (batch_size, seq_len)
            keep = batch["weights"] > 0
            targets.append(batch["targets"][keep])
            inputs_at.append(batch["inputs"][keep])
        scored[seq_len] = (np.concatenate(inputs_at), np.concatenate(targets))
    np.testing.assert_array_equal(scored[64][1], scored[256][1])
    np.testing.assert_array_equal(scored[64][0], scored[256][0])
    tokens = valid_stream.tokens.astype(np.int32)
    if not packed:
        np.testing.assert_array_equal(scored[64][1], tokens[1:num_tokens + 1])
    else:
        new_doc = np.isin(np.arange(1, num_tokens + 1), valid_stream.doc_starts)
        np.testing.assert_array_equal(scored[64][1], tokens[1:num_tokens + 1][~new_doc])


def test_eval_process_shares_concatenate(valid_stream):
    kw = {"seq_len": 32, "num_tokens": 1000, "batch_size": 4}
    whole = list(data.eval_batches(valid_stream, **kw))
    halves = [list(data.eval_batches(valid_stream, process_index=p, process_count=2, **kw))
              for p in range(2)]
    for w, a, b in zip(whole, *halves, strict=True):
        for key in w:
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), w[key])


def test_grain_dataset_is_indexed_by_step_and_shards_by_process(data_dir):
    source = data.get_source("python_stdlib", "validation", data_dir=data_dir)
    kw = {"seq_len": 48, "batch_size": 4, "seed": 7}
    ds = data.grain_dataset(source, **kw)
    first, again = ds[3], data.grain_dataset(source, **kw)[3]
    assert first["inputs"].shape == (4, 48) and first["inputs"].dtype == np.int32
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    np.testing.assert_array_equal(first["targets"][:, :-1], first["inputs"][:, 1:])
    shares = [data.grain_dataset(source, process_index=p, process_count=2, **kw)[3]
              for p in range(2)]
    for key in first:
        np.testing.assert_array_equal(np.concatenate([s[key] for s in shares]), first[key])


# ---------------------------------------------------------------- synthetic tasks

@pytest.mark.parametrize("task", synthetic.TASKS)
def test_synthetic_tasks_are_deterministic_and_hold_their_answer(task):
    def make(seed, split="train"):
        return data.get_source(task, split, seed=seed, num_examples=50, min_len=100,
                               max_len=400)

    a, b, c = make(1), make(1), make(2)
    assert [bytes(x) for x in a] == [bytes(x) for x in b]
    assert [bytes(x) for x in a] != [bytes(x) for x in c]
    assert bytes(make(1, "validation")[0]) != bytes(a[0])
    for i in range(len(a)):
        doc = bytes(a[i])
        start, stop = a.answer_span(i)
        answer = doc[start:stop]
        assert doc.endswith(b"\n") and stop >= len(doc) - 2 and 60 <= len(doc) <= 460
        before = doc[:start]
        if task == "copy":
            assert before == answer + b"=" and answer.isalpha()
        elif task == "passkey":
            assert len(answer) == 5 and answer.isdigit() and before.endswith(b"key=")
            assert b"key=" + answer + b". " in before and doc.count(answer) == 2
        else:
            key = before.split(b"? ")[-1].rstrip(b"=")
            assert len(answer) == 2 and answer.isdigit()
            assert b" " + key + b"=" + answer + b" " in b" " + before.split(b" ? ")[0] + b" "


# ---------------------------------------------------------------- any TFDS name (mocked)

def test_mock_tfds_dataset_by_name(tmp_path):
    with tfds.testing.mock_data(num_examples=6):
        source = data.get_source("lm1b", "train", data_dir=tmp_path)
        docs = [source[i] for i in range(len(source))]
        with pytest.raises(ValueError, match="text_key='body' is not a feature.*'text'"):
            data.get_source("lm1b", "train", data_dir=tmp_path, text_key="body")
    assert len(docs) == 6 and all(d.dtype == np.uint8 and d.ndim == 1 for d in docs)
    stream = data.TokenStream.from_documents(docs)
    assert len(stream) == sum(d.size for d in docs) and stream.num_documents == 6
    batch = data.train_batch(stream, step=0, batch_size=2, seq_len=4, seed=0)
    assert batch["inputs"].shape == (2, 4)


class PosencTestTinyText(tfds.core.GeneratorBasedBuilder):
    """A real (unmocked) TFDS text dataset with its text under another key."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"body": tfds.features.Text(), "id": np.int64}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(5):
            yield i, {"body": f"tiny document {i}\n" * (i + 1), "id": i}


def test_real_prepared_tfds_dataset_by_name_and_text_key(tmp_path):
    PosencTestTinyText(data_dir=tmp_path).download_and_prepare(
        file_format="array_record",
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    source = data.get_source("posenc_test_tiny_text", "train", data_dir=tmp_path,
                             text_key="body")
    texts = sorted(bytes(source[i]) for i in range(len(source)))
    assert texts == sorted(f"tiny document {i}\n".encode() * (i + 1) for i in range(5))
    assert source.identity["num_examples"] == 5
    with pytest.raises(ValueError, match=r"text_key='text' is not a feature.*\['body', 'id'\]"):
        data.get_source("posenc_test_tiny_text", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"has splits \['train'\], got split='validation'"):
        data.get_source("posenc_test_tiny_text", "validation", data_dir=tmp_path,
                        text_key="body")


# ---------------------------------------------------------------- errors name what was wrong

def test_missing_or_empty_data_dir_and_unknown_name_are_clear_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"'lm1b' is not prepared.*nope' does not exist"):
        data.get_source("lm1b", "train", data_dir=missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"'lm1b' is not prepared.*empty' is empty.*tfds build"):
        data.get_source("lm1b", "train", data_dir=tmp_path / "empty")
    with pytest.raises(ValueError, match=r"unknown dataset name 'no_such_set'.*python_stdlib"
                                         r".*passkey.*prepared.*data_dir="):
        data.get_source("no_such_set", "train", data_dir=tmp_path / "empty")
    with pytest.raises(ValueError, match=r"text_dir path=.*nope' is not an existing directory"):
        data.get_source("text_dir", "train", data_dir=tmp_path, path=missing)
    with pytest.raises(ValueError, match=r"no files matching pattern='\*\*/\*.txt'"):
        data.get_source("text_dir", "train", data_dir=tmp_path, path=tmp_path / "empty")
    with pytest.raises(ValueError, match="text_dir needs path="):
        data.get_source("text_dir", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"splits \('train', 'validation', 'test'\).*'dev'"):
        data.get_source("copy", "dev")
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic.SyntheticTask("reverse", "train")


def test_batch_arguments_are_checked():
    stream = _stream([10, 10])
    with pytest.raises(ValueError, match="batch_size=6 must be divisible by process_count=4"):
        data.train_batch(stream, step=0, batch_size=6, seq_len=4, seed=0, process_count=4)
    with pytest.raises(ValueError, match=r"20 tokens, fewer than seq_len\+1=21"):
        data.train_batch(stream, step=0, batch_size=2, seq_len=20, seed=0)
    with pytest.raises(ValueError, match=r"step must be >= 0, got step=-1"):
        data.train_batch(stream, step=-1, batch_size=2, seq_len=4, seed=0)
    with pytest.raises(TypeError, match=r"seed must be an int, got seed=0.5 \(float\)"):
        data.train_batch(stream, step=0, batch_size=2, seq_len=4, seed=0.5)
    with pytest.raises(ValueError, match=r"num_tokens must be <= 19, got num_tokens=20"):
        next(data.eval_batches(stream, seq_len=4, num_tokens=20, batch_size=2))
    with pytest.raises(ValueError, match=r"process_index must be <= 1, got process_index=2"):
        data.train_batch(stream, step=0, batch_size=2, seq_len=4, seed=0, process_index=2,
                         process_count=2)
    with pytest.raises(TypeError, match=r"seq_len must be an int, got seq_len='4' \(str\)"):
        data.train_batch(stream, step=0, batch_size=2, seq_len="4", seed=0)


def test_default_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(common.DATA_DIR_ENV, str(tmp_path / "x"))
    assert common.resolve_data_dir(None) == str(tmp_path / "x")
    monkeypatch.delenv(common.DATA_DIR_ENV)
    assert common.default_data_dir() == str(
        pathlib.Path("~/.cache/posenc_jax/tfds").expanduser())

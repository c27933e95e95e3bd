"""posenc_jax.pretrained.tokenizer: tokenizer.json directories and GGUF vocabularies.

Always run: the tiny fixture's tokenizer.json (tests/data/pretrained/tiny/llama, ids from
transformers' AutoTokenizer) and tiny GGUF vocabularies written here (byte-level BPE and Gemma's
SentencePiece style), round trips as properties. With the real files ($POSENC_PRETRAINED_DIR):
SmolLM2's and Gemma 3's ids and decodes equal transformers' on every golden text.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import gguf
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc_jax.pretrained import gguf_tokenizer
from posenc_jax.pretrained.tokenizer import Tokenizer

DATA = pathlib.Path(__file__).parents[1] / "data" / "pretrained"
REAL_DIR = pathlib.Path(os.environ.get("POSENC_PRETRAINED_DIR",
                                       pathlib.Path(__file__).parents[2] / ".pretrained"))
REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}


def test_directory_tokenizer_matches_transformers():
    tok = Tokenizer.from_directory(DATA / "tiny" / "llama")
    gold = json.loads((DATA / "tiny" / "llama" / "tokenizer_ids.json").read_text())
    assert (tok.bos_id, tok.eos_id) == (gold["bos_id"], gold["eos_id"])
    for case in gold["cases"]:
        assert tok.encode(case["text"]) == case["ids"]
        assert tok.decode(case["ids"]) == case["decode"]
        assert tok.encode(case["text"], add_bos=True) == [tok.bos_id, *case["ids"]]


def write_vocab(path: pathlib.Path, arch: str, tokens: list[str], types: list[int], *,
                model: str, merges: list[str] | None = None, bos: int | None = None) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
        w.add_eos_token_id(bos + 1)
    w.add_block_count(1)
    w.add_embedding_length(4)
    w.add_head_count(1)
    w.add_feed_forward_length(8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> Tokenizer:
    alphabet = list(gguf_tokenizer.byte_alphabet().values())
    tokens = ["<|end|>", "<|start|>", *alphabet, "Ġt", "he", "Ġthe", "<think>"]
    types = [3, 3] + [1] * (len(tokens) - 3) + [4]
    path = tmp_path_factory.mktemp("bl") / "bl.gguf"
    write_vocab(path, "llama", tokens, types, model="gpt2", merges=["Ġ t", "h e", "Ġt he"],
                bos=None)
    return Tokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory) -> Tokenizer:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>",
              *[f"<0x{b:02X}>" for b in range(256)], "\u2581", "a", "b", "ab", "\u2581ab", "  "]
    types = [3, 3, 3, 2, 1, 3] + [6] * 256 + [1] * 6
    path = tmp_path_factory.mktemp("gm") / "gm.gguf"
    write_vocab(path, "gemma3", tokens, types, model="llama", bos=2)
    return Tokenizer.from_gguf(path)


def test_byte_level_merges_and_specials(byte_level):
    tok = byte_level
    the = tok.backend.token_to_id("Ġthe")
    assert tok.encode(" the") == [the] and tok.bos_id is None
    assert tok.encode("<|start|> the<|end|>") == [1, the, 0]
    assert tok.encode("<think>") == [tok.backend.token_to_id("<think>")]
    assert tok.decode([1, the, 0], skip_special_tokens=True) == " the"
    with pytest.raises(ValueError, match=r"add_bos=True but .*bl\.gguf names no BOS token"):
        tok.encode("x", add_bos=True)


def test_gemma_like_merges_bos_and_byte_fallback(gemma_like):
    tok = gemma_like
    ab, sp_ab = tok.backend.token_to_id("ab"), tok.backend.token_to_id("\u2581ab")
    assert tok.encode("ab ab") == [2, ab, sp_ab]  # the file asks for BOS (llama-type default)
    assert tok.encode("ab ab", add_bos=False) == [ab, sp_ab]
    # "é" is not in the vocabulary: its two UTF-8 bytes, as <0xC3> <0xA9>
    assert tok.encode("é", add_bos=False) == [6 + 0xC3, 6 + 0xA9]
    assert tok.encode("<start_of_turn>a", add_bos=False) == [5, tok.backend.token_to_id("a")]
    # a whitespace-only token with spaces is respelled as that many "\u2581"
    assert tok.backend.token_to_id("\u2581\u2581") == len(tok.backend.get_vocab()) - 1
    assert (tok.bos_id, tok.eos_id) == (2, 3)


@given(text=st.text(max_size=40))
def test_byte_level_round_trip(byte_level, text):
    assert byte_level.decode(byte_level.encode(text)) == text


@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_gemma_like_round_trip(gemma_like, text):
    ids = gemma_like.encode(text, add_bos=False)
    assert gemma_like.decode(ids) == text


def test_errors(tmp_path, byte_level):
    path = tmp_path / "t5.gguf"
    write_vocab(path, "llama", ["a", "b"], [1, 1], model="t5")
    with pytest.raises(ValueError, match=r"t5\.gguf: tokenizer.ggml.model='t5' with "
                                         r"architecture 'llama' is not supported"):
        Tokenizer.from_gguf(path)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_directory(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a readable tokenizer.json"):
        Tokenizer.from_directory(tmp_path)
    with pytest.raises(TypeError, match="encode: text must be a str, got bytes"):
        byte_level.encode(b"x")
    with pytest.raises(ValueError, match=r"decode: ids \[100000\] are outside the vocabulary"):
        byte_level.decode([1, 100000])


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request):
    path = REAL_DIR / REAL[request.param]
    if not path.is_file():
        pytest.skip(f"{path} absent: run `bash scripts/fetch_pretrained.sh {REAL_DIR}`")
    return request.param, Tokenizer.from_gguf(path)


def test_real_tokenizers_match_transformers(real):
    key, tok = real
    meta = json.loads((DATA / f"{key}.json").read_text())
    ids = np.load(DATA / f"{key}.npz")
    gold = meta["tokenizer"]
    assert (tok.bos_id, tok.eos_id) == (gold["bos_id"], gold["eos_id"])
    for name, case in gold["cases"].items():
        assert tok.encode(case["text"]) == case["ids"], name
        assert tok.encode(case["text"], add_bos=False) == case["ids_no_special"], name
        assert tok.decode(case["ids_no_special"]) == case["decode_no_special"], name
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["decode_skip_special"]
    backend = json.loads(tok.backend.to_str())  # the same merges in the same order, same specials
    merges = "\n".join(" ".join(m) for m in backend["model"]["merges"])
    added = "\n".join(f"{a['id']} {a['content']} {int(a['special'])}"
                      for a in sorted(backend["added_tokens"], key=lambda a: a["id"]))
    assert len(backend["model"]["merges"]) == gold["merges_count"]
    assert hashlib.sha256(merges.encode()).hexdigest() == gold["merges_sha256"]
    assert (len(backend["added_tokens"]), hashlib.sha256(added.encode()).hexdigest()) == (
        gold["added_count"], gold["added_sha256"])
    for name, text in meta["texts"].items():  # the long one is cut to 1,500 tokens
        assert tok.encode(text)[:1500] == ids[f"{name}__ids"].tolist(), name
    for prompt, g in meta["greedy"].items():
        assert tok.encode(prompt) == g["prompt_ids"]
        assert tok.decode(g["new_ids"]) == g["text"]

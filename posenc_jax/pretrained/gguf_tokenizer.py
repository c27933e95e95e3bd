"""A `tokenizers.Tokenizer` built from a GGUF file's own vocabulary, merges and token types.

The same pipeline transformers 5.24 builds from the file (AutoTokenizer with gguf_file), so the
ids are the same for the same text (checked on SmolLM2 and Gemma 3 against goldens):

* `tokenizer.ggml.model == "gpt2"` (SmolLM2, Llama 3, Qwen): byte-level BPE. Tokens the file
  spells outside the GPT-2 byte alphabet are respelled byte by byte; merges from the file;
  the split regex named by `tokenizer.ggml.pre` (llama3 / qwen2 families), else GPT-2's own
  (ByteLevel's regex), as transformers does for e.g. "smollm".
* `tokenizer.ggml.model == "llama"` for the gemma / gemma2 / gemma3 architectures: SentencePiece-
  style BPE with byte fallback, " " -> "\u2581" as the normalizer. Tokens made only of whitespace
  that contain a space are respelled as that many "\u2581". The file has no merges: every split
  of a token into two tokens is a merge, ranked by the token's position in the file (earlier
  first), ties by the longer left part, then the longer right part; splits of one token are
  first ordered by the ids of their halves.

Tokens typed CONTROL (3) in the file, and the family's pad / eos / bos / unk / mask tokens, are
special added tokens; USER_DEFINED (4) ones are plain added tokens: both always match whole.
"""

from __future__ import annotations

from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

__all__ = ["build_gguf_tokenizer", "byte_alphabet"]

CONTROL, USER_DEFINED = 3, 4
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3,
          "dbrx": _LLAMA3, "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
_GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: the printable Latin-1 bytes map to
    themselves, the other 68 to chr(256), chr(257), ... in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(table.items()))


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[t] = i  # a repeated spelling keeps its first place and its last id
    return vocab


def _byte_level(tokens: list[str], merges: list[str], pre: str | None) -> Tokenizer:
    table = byte_alphabet()
    alphabet = set(table.values())
    spelled = [t if set(t) <= alphabet else "".join(table[b] for b in t.encode("utf-8"))
               for t in tokens]
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab=_vocab(spelled), merges=pairs, dropout=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    split = SPLITS.get(pre)
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _position_merges(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) split of a token into two tokens, best first: tokens by the position
    of their (last) spelling in the file, then the longer left part first.

    This is the order transformers' merge generation gives (rank = -position, sorted by rank,
    len(left), len(right), descending): one token's splits all differ in len(left), so its
    secondary sort by the halves' ids never decides."""
    last = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token in sorted(last, key=last.__getitem__):
        for k in range(len(token) - 1, 0, -1):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges


def _gemma(tokens: list[str]) -> Tokenizer:
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = _vocab(spelled)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_position_merges(spelled, vocab),
                               dropout=None, fuse_unk=True, unk_token="<unk>",
                               byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return tok


def _checked_vocabulary(field: Any, tokens: list[str], rows: int | None, where: str) -> None:
    """ValueError naming `where` and the key: fewer tokens than embedding rows, a token type
    list of another length, or a bos / eos / unk / pad id outside [0, len(tokens))."""
    if rows is not None and len(tokens) < rows:
        raise ValueError(f"{where}: tokenizer.ggml.tokens has {len(tokens)} tokens but the "
                         f"embedding has {rows} rows: ids {len(tokens)}..{rows - 1} would have "
                         "no text (llama.cpp needs one token per row)")
    types = field("tokenizer.ggml.token_type")
    if types is not None and len(types) != len(tokens):
        raise ValueError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries, "
                         f"tokenizer.ggml.tokens {len(tokens)}: one type per token")
    for key in ("bos", "eos", "unknown", "padding"):
        value = field(f"tokenizer.ggml.{key}_token_id")
        if value is not None and not 0 <= int(value) < len(tokens):
            raise ValueError(f"{where}: tokenizer.ggml.{key}_token_id = {int(value)} is "
                             f"outside the vocabulary [0, {len(tokens)}) of "
                             "tokenizer.ggml.tokens")


def _merges(field: Any, where: str) -> list[str]:
    merges = field("tokenizer.ggml.merges")
    if not merges:
        raise ValueError(f"{where}: tokenizer.ggml.model='gpt2' (byte-level BPE) needs "
                         "tokenizer.ggml.merges, which the file lacks or leaves empty: without "
                         "merges every text splits into single bytes")
    bad = next((m for m in merges if len(m.split(" ")) != 2), None)
    if bad is not None:
        raise ValueError(f"{where}: tokenizer.ggml.merges holds {bad!r}, not two tokens "
                         "joined by one space")
    return merges


def build_gguf_tokenizer(field: Any, *, where: str,
                         rows: int | None = None) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizer, info) from a GGUF file's metadata; `field(key, default)` reads a value.

    info: `bos_id`, `eos_id` (int or None), `add_bos`, `add_eos` (what the file asks for;
    the tokenizer's post-processor already adds them). `rows`: the embedding's rows, when
    known (fewer tokens than rows is refused). ValueError naming `where` and the key for a
    tokenizer model this does not build, a gpt2 model without merges (or merges naming tokens
    the vocabulary lacks), or a special token id outside the vocabulary.
    """
    kind, arch = field("tokenizer.ggml.model"), field("general.architecture")
    tokens = field("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError(f"{where}: the GGUF file has no tokenizer.ggml.tokens (no vocabulary)")
    _checked_vocabulary(field, tokens, rows, where)
    types = [int(t) for t in field("tokenizer.ggml.token_type", [])]
    specials: list[str] = []
    if kind == "gpt2":
        merges = _merges(field, where)
        try:
            tok = _byte_level(tokens, merges, field("tokenizer.ggml.pre"))
        except Exception as e:  # tokenizers raises a bare Exception
            raise ValueError(f"{where}: tokenizer.ggml.merges do not fit tokenizer.ggml.tokens "
                             f"({e})") from None
        alphabet = set(byte_alphabet().values())
        control = [t for t, ty in zip(tokens, types) if ty == CONTROL and set(t) <= alphabet]
        add_bos_default = False
    elif kind == "llama" and arch in _GEMMA_ARCHS:
        tok = _gemma(tokens)
        control = [t for t, ty in zip(tokens, types) if ty == CONTROL]
        present = set(tokens)
        specials = [t for t in _GEMMA_SPECIALS if t in present]
        add_bos_default = True
    else:
        raise ValueError(f"{where}: tokenizer.ggml.model={kind!r} with architecture {arch!r} "
                         "is not supported (supported: 'gpt2'; 'llama' for gemma, gemma2, gemma3)")
    vocab = tok.get_vocab()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in dict.fromkeys([*specials, *control])])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED and t in vocab])

    def token_id(key: str) -> int | None:
        value = field(key)
        return None if value is None else int(value)

    info = {"bos_id": token_id("tokenizer.ggml.bos_token_id"),
            "eos_id": token_id("tokenizer.ggml.eos_token_id"),
            "add_bos": bool(field("tokenizer.ggml.add_bos_token", add_bos_default)),
            "add_eos": bool(field("tokenizer.ggml.add_eos_token", False))}
    single, ids = ["$A"], []
    if info["add_bos"] and info["bos_id"] is not None:
        single.insert(0, tokens[info["bos_id"]])
        ids.append((tokens[info["bos_id"]], info["bos_id"]))
    if info["add_eos"] and info["eos_id"] is not None:
        single.append(tokens[info["eos_id"]])
        ids.append((tokens[info["eos_id"]], info["eos_id"]))
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=ids)
    return tok, info

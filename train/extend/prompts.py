"""The passkey-retrieval prompt of the YaRN and LongRoPE papers (after Mohtashami & Jaggi 2023).

    prompt = passkey_prompt(encode, length=n, depth=0.5, key="31415")
    ok = answer_matches(decoded_text, "31415")

The prompt is the task line, repeated filler with the key line at `depth` (0: right after the
task, 1: just before the question), then the question:

    There is an important info hidden inside a lot of irrelevant text. Find it and memorize
    them. I will quiz you about the important information there.
     The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.
     ... The pass key is 31415. Remember it. 31415 is the pass key. ...
     What is the pass key? The pass key is

Each piece is tokenized once on its own and the ids concatenated, so the prompt has exactly
`length` tokens for every depth and key: the filler before and after the key is cut to the
token (the last repetition may be partial). That makes every prompt of a length one shape
(one compile) and puts the key at a known token offset.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Sequence

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
        "memorize them. I will quiz you about the important information there.")
FILLER = (" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again.")
KEY_LINE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids, the key, the depth asked for and the key line's token
    offset."""

    ids: tuple[int, ...]
    key: str
    depth: float
    key_offset: int


def passkey_prompt(encode: Callable[[str], Sequence[int]], *, length: int, depth: float,
                   key: str, prefix: Sequence[int] = ()) -> Prompt:
    """A prompt of exactly `length` token ids (`prefix`, e.g. BOS, included).

    encode: text -> ids (the model's tokenizer). depth: in [0, 1], the fraction of the filler
    placed before the key line. ValueError when `length` cannot hold the task, key and
    question.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got depth={depth}")
    head = list(prefix) + list(encode(TASK))
    filler = list(encode(FILLER))
    key_ids = list(encode(KEY_LINE.format(key=key)))
    tail = list(encode(QUESTION))
    room = length - len(head) - len(key_ids) - len(tail)
    if room < 0 or not filler:
        raise ValueError(f"length={length} is too short for the passkey prompt (it needs "
                         f"{length - room} tokens without filler)")
    before = round(depth * room)

    def fill(n: int) -> list[int]:
        reps = -(-n // len(filler))
        return (filler * reps)[:n]

    ids = head + fill(before) + key_ids + fill(room - before) + tail
    return Prompt(ids=tuple(ids), key=key, depth=float(depth), key_offset=len(head) + before)


def make_keys(count: int, *, digits: int, seed: int) -> list[str]:
    """`count` random keys of `digits` digits (no leading zero), the same for a seed."""
    rng = random.Random(seed)
    return [str(rng.randrange(10 ** (digits - 1), 10 ** digits)) for _ in range(count)]


def answer_matches(text: str, key: str) -> bool:
    """Exact match: the first number in the decoded continuation is the key (so ' 31415.'
    and '31415' count; '3141', '314150' and 'The key is 31415' do not)."""
    found = re.match(r"\s*(\d+)", text)
    return found is not None and found.group(1) == key

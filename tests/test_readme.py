"""The README's tour is code a newcomer copies: run it, so the README stays true."""

import ast
import pathlib
import re

import posenc_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_tour_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks, "README.md has no python block"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md:tour", "exec"), namespace)  # noqa: S102
    assert namespace["logits"].shape == (2, 32, 256)
    assert namespace["tokens"].shape[-1] >= 8
    assert namespace["bias"].shape == (4, 16, 16)


def test_readme_tour_lists_every_registered_name():
    """The comment after `print(posenc_jax.names())` is what a reader expects to see."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"print\(posenc_jax\.names\(\)\)\s*#\s*(\[.*?\])", text, re.DOTALL)
    assert match, "the tour no longer prints posenc_jax.names()"
    shown = ast.literal_eval(re.sub(r"\n\s*#", "", match.group(1)))
    assert shown == posenc_jax.names()


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    assert "bash scripts/study.sh" in text and "bash scripts/test.sh" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()

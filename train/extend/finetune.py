"""The fine-tuned row of the extension study (for the accelerator run): SmolLM2 with YaRN x4
fine-tuned at 4C = 32768 tokens on long documents, then measured like the zero-shot rows.

    python -m train.extend.finetune --out=DIR [--steps=200] [--smoke]

`benchmarks/device_check.py` runs it as its `extend_finetune` section. Steps:

1. load SmolLM2 (`posenc_jax.pretrained.load`) with the YaRN dict of factor 4 (the registry's
   stretch rule, as the zero-shot rows use it), attention "auto" (the kernel on a GPU);
2. measure it zero-shot: perplexity by position bucket over the first 4C + 1 tokens of the
   prose text, passkey at C, 2C, 4C;
3. fine-tune: AdamW (lr 2e-5, as the YaRN paper), one window of 4C tokens a step, windows
   drawn from long standard-library modules that are not among the evaluated texts;
4. measure again, and write DIR/extend_finetune.json and .md: before and after, per bucket and
   per passkey length, and the supported length by the study's criterion (`table`).

--smoke: the same on a tiny random model (C = 32) for a CPU dry run, in seconds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from posenc_jax import pretrained
from posenc_jax.model.config import TransformerConfig
from posenc_jax.model.loss import token_nll
from posenc_jax.model.transformer import Transformer
from train.engine import scalings
from train.extend import measure, plan, prompts, table, texts

FACTOR = 4
SMOLLM2 = ("SmolLM2-135M-Instruct.Q4_1.gguf", 8192, 64)  # file, context C, rotary dim


def train_text(min_bytes: int = 60_000) -> str:
    """Long standard-library modules (at least `min_bytes`), minus the evaluated ones."""
    root = texts.stdlib_dir()
    skip = set(texts.CODE_MODULES)
    names = sorted(f for f in os.listdir(root) if f.endswith(".py") and f not in skip
                   and os.path.getsize(os.path.join(root, f)) >= min_bytes)
    return "\n\n".join(texts._read(os.path.join(root, f)) for f in names)


def _loss(graphdef, state, window):
    model = nnx.merge(graphdef, state)
    hidden = model.hidden_states(window[None, :-1],
                                 jnp.arange(window.shape[0] - 1, dtype=jnp.int32))
    return token_nll(model.head, hidden, window[None, 1:],
                     chunk=min(measure.CHUNK, window.shape[0] - 1)).mean()


def finetune(model, ids: np.ndarray, *, steps: int, length: int, lr: float, seed: int = 0,
             log=print):
    """`model` trained `steps` AdamW steps on random windows of `length` + 1 tokens of
    `ids`; returns (model, losses)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.0)
    opt = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt, window):
        loss, grads = jax.value_and_grad(
            lambda p: _loss(graphdef, nnx.merge_state(p, rest), window))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    rng, losses = np.random.default_rng(seed), []
    for i in range(steps):
        start = int(rng.integers(0, len(ids) - length - 1))
        params, opt, loss = step(params, opt, jnp.asarray(ids[start:start + length + 1]))
        losses.append(float(loss))
        if i % max(1, steps // 10) == 0 or i == steps - 1:
            log(f"finetune step {i + 1}/{steps}: loss {losses[-1]:.4f}")
    return nnx.merge(graphdef, params, rest), losses


def evaluate(model, tokenizer, *, context: int, add_bos: bool, depths, keys) -> dict:
    """Buckets over the first 4C positions of the prose text and passkey at C, 2C, 4C."""
    n = FACTOR * context
    nll = measure.position_nll(model, texts.document_ids(tokenizer, "prose", n + 1,
                                                         add_bos=add_bos))
    out = {"ppl": {str(m): measure.perplexity(nll[:m]) for m in (context, 2 * context, n)},
           "buckets": [list(b) for b in measure.bucket_perplexity(nll, context=context)],
           "passkey": {}}
    bos = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
    for m in (context, 2 * context, n):
        items = [prompts.passkey_prompt(functools.partial(texts.plain_ids, tokenizer),
                                        length=m - 8, depth=d, key=k,
                                        prefix=bos) for d in depths for k in keys]
        answers = measure.passkey_answers(model, [p.ids for p in items],
                                          decode=tokenizer.decode, max_new_tokens=8)
        out["passkey"][str(m)] = float(np.mean([prompts.answer_matches(a, p.key)
                                                for a, p in zip(answers, items)]))
    return out


def supported(result: dict, *, ref: float, context: int) -> dict:
    """The study's criterion on one evaluation: (ppl within 10% of `ref`, passkey >= 0.9)."""
    ppl = {int(k): v for k, v in result["ppl"].items()}
    pk = {int(k): v for k, v in result["passkey"].items()}
    return {"ppl_len": table.longest(ppl, lambda v: v <= 1.1 * ref, start=context),
            "passkey_len": table.longest(pk, lambda v: v >= 0.9)}


class SmokeTokenizer:
    """--smoke's tokenizer: one id per whitespace-led word (first sight order, wrapping at
    125 + 3), BOS 1: short passkey prompts for a tiny model."""

    bos_id, eos_id = 1, 2

    def __init__(self):
        self.ids, self.words = {}, {}

    def encode(self, text):
        out = []
        for word in text.replace("\n", " \n ").split(" "):
            if word:
                i = self.ids.setdefault(" " + word, 3 + len(self.ids) % 125)
                self.words.setdefault(i, " " + word)
                out.append(i)
        return out

    def decode(self, ids):
        return "".join(self.words.get(i, "?") for i in ids)


def smoke_load(path, *, dtype="float32", rope_scaling=None):
    """A tiny random RoPE model (same params for every scaling) for --smoke."""
    kwargs = {"base": 1000.0, **({"scaling": rope_scaling} if rope_scaling else {})}
    cfg = TransformerConfig(vocab_size=128, num_layers=2, embed_dim=32, num_heads=4,
                            num_kv_heads=2, mlp_dim=64, encoding_kwargs=kwargs,
                            attention="blockwise", block_size=32)
    return argparse.Namespace(model=Transformer(cfg, rngs=nnx.Rngs(0)),
                              tokenizer=SmokeTokenizer(), config=cfg)


def run(args, load) -> dict:
    """Steps 1-4 of the module docstring; writes args.out/extend_finetune.{json,md}."""
    if args.method not in plan.all_methods()[1:]:
        raise ValueError(f"--method={args.method!r}; valid: {', '.join(plan.all_methods()[1:])}")
    file, context, rotary = ("smoke", 64, 8) if args.smoke else SMOLLM2
    root = args.pretrained_dir or os.environ.get("POSENC_PRETRAINED_DIR") or ".pretrained"
    path = os.path.join(root, file)
    if not args.smoke and not os.path.exists(path):
        raise SystemExit(f"extend_finetune: {path} is missing (bash scripts/fetch_pretrained.sh "
                         "DIR, then --pretrained_dir=DIR or POSENC_PRETRAINED_DIR=DIR)")
    out = {"method": args.method, "factor": FACTOR, "context": context, "steps": args.steps,
           "lr": args.lr, "smoke": args.smoke, "device": str(jax.devices()[0])}
    os.makedirs(args.out, exist_ok=True)

    def save():
        with open(os.path.join(args.out, "extend_finetune.json"), "w") as f:
            json.dump(out, f, indent=1)

    t = time.perf_counter()
    base = load(path, dtype="float32", rope_scaling=None)
    add_bos = False  # SmolLM2's tokenizer adds no BOS (configs/extend_smollm2.py)
    ref_ids = texts.document_ids(base.tokenizer, "prose", context + 1, add_bos=add_bos)
    out["ref_ppl_at_C"] = measure.perplexity(measure.position_nll(base.model, ref_ids))
    del base
    sc = scalings.scaling_config(args.method, factor=FACTOR, train_len=context,
                                 rotary_dim=rotary)
    out["rope_scaling"] = sc
    loaded = load(path, dtype="float32", rope_scaling=sc)
    keys = prompts.make_keys(1, digits=5, seed=0)
    ev = functools.partial(evaluate, tokenizer=loaded.tokenizer, context=context,
                           add_bos=add_bos, depths=(0.1, 0.5, 0.9), keys=keys)
    out["zero_shot"] = ev(loaded.model)
    out["zero_shot"]["supported"] = supported(out["zero_shot"], ref=out["ref_ppl_at_C"],
                                              context=context)
    save()
    ids = np.asarray(texts.encode(loaded.tokenizer, train_text()[: args.train_chars],
                                  add_bos=False), np.int32)
    out["train_tokens"] = int(ids.size)
    start = time.perf_counter()
    model, losses = finetune(loaded.model, ids, steps=args.steps, length=FACTOR * context,
                             lr=args.lr)
    out["train_seconds"], out["losses"] = time.perf_counter() - start, losses
    out["fine_tuned"] = ev(model)
    out["fine_tuned"]["supported"] = supported(out["fine_tuned"], ref=out["ref_ppl_at_C"],
                                               context=context)
    out["seconds"] = time.perf_counter() - t
    save()
    with open(os.path.join(args.out, "extend_finetune.md"), "w") as f:
        f.write(markdown(out))
    return out


def markdown(out: dict) -> str:
    c = out["context"]
    lines = [(f"# {out['method']} x{out['factor']} fine-tuned at {out['factor'] * c} tokens "
             f"({out['steps']} steps, lr {out['lr']}; {out['device']})"), "",
             f"Reference: perplexity at C = {c} without scaling {out['ref_ppl_at_C']:.3f}.", "",
             ("| | ppl C | ppl 2C | ppl 4C | passkey C | passkey 2C | passkey 4C | ppl within "
             "10% up to | passkey >= 0.9 up to |"), "|---|---|---|---|---|---|---|---|---|"]
    for name in ("zero_shot", "fine_tuned"):
        r = out.get(name)
        if r:
            ns = [str(c), str(2 * c), str(4 * c)]
            lines.append(f"| {name.replace('_', ' ')} | " + " | ".join(
                f"{r['ppl'][n]:.3f}" for n in ns) + " | " + " | ".join(
                f"{r['passkey'][n]:.2f}" for n in ns) + f" | {r['supported']['ppl_len']} | "
                f"{r['supported']['passkey_len']} |")
    if out.get("losses"):
        lines += ["", (f"Training loss {out['losses'][0]:.3f} -> {out['losses'][-1]:.3f} in "
                      f"{out['train_seconds']:.0f} s ({out['train_tokens']} tokens of stdlib "
                      "code to draw windows from).")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--method", default="yarn")
    parser.add_argument("--train_chars", type=int, default=4_000_000)
    parser.add_argument("--pretrained_dir", default="")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.lr, args.train_chars = min(args.steps, 3), 1e-3, 200_000
        return run(args, smoke_load)
    load = getattr(pretrained, "load", None)  # issue 21's loader; absent in older checkouts
    if load is None:
        raise SystemExit("extend_finetune needs posenc_jax.pretrained.load (issue 21), which "
                         "this checkout does not have yet")
    return run(args, load)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where a forward's time goes, ours and transformers', piece by piece (`pretrained_forward.py
--breakdown`).

Ours: each piece of one decoder block (block 0 of the loaded model; SmolLM2's blocks are all
alike) is jitted on its own and timed at the forward's shapes (median of `repeats`), then
scaled by the number of layers; the whole forward's seconds are the caller's trials':

    attention core        `attend(q, k, v)`: softmax(q k^T) v with the model's backend
    projections + rope    the attention module minus its core (q, k, v, o matmuls, RoPE)
    mlp                   the MLP module (three matmuls and the gate)
    norms + residuals     the block minus its attention module and its MLP
    head                  the final norm and the logits [1, L, V]
    rest                  the whole forward minus all of the above (embedding, glue, and
                          what XLA fuses differently across pieces: can be negative)

transformers: one forward with hooks that time the same pieces as they run (PyTorch eager
on a CPU is synchronous, so a hook's clock is the op's): `scaled_dot_product_attention`
itself, the four projections (the self-attention module minus SDPA and projections is
"rope + reshapes", reported inside "projections + rope"), the MLP, the two norms per layer,
`lm_head` with the final norm, and the rest of the forward.

Each side returns {piece: seconds of one whole forward}, "whole" included.
Shapes: B = 1, L tokens, E embed, H / K query / kv heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import statistics
import time

PIECES = ("attention core", "projections + rope", "mlp", "norms + residuals", "head", "rest")


# --- ours (JAX) -----------------------------------------------------------------------------
def ours_pieces(model, length: int, whole: float, repeats: int = 3) -> dict[str, float]:
    """{piece: seconds} of `model` (a posenc_jax Transformer, no scan) at L = `length`, given
    `whole`: the seconds of its whole jitted forward there (the caller's trials)."""
    import jax  # this module is imported by the torch worker too: JAX only on our side
    import jax.numpy as jnp
    from flax import nnx

    from posenc_jax.model.attention import attend

    cfg = model.config
    block = model.layers[0]
    pos = jnp.arange(length, dtype=jnp.int32)[None]
    key = jax.random.key(0)
    x = jax.random.normal(key, (1, length, cfg.embed_dim), jnp.float32).astype(cfg.dtype)
    q = jax.random.normal(key, (1, length, cfg.num_heads, cfg.head_dim), cfg.dtype)
    kv = jax.random.normal(key, (1, length, cfg.num_kv_heads, cfg.head_dim), cfg.dtype)

    def jitted(module, fn):
        graphdef, state = nnx.split(module)
        f = jax.jit(lambda s, *a: fn(nnx.merge(graphdef, s), *a))
        return lambda *a: f(state, *a)

    enc = block.attn.encoding
    core = jax.jit(lambda q, k, v: attend(
        q, k, v, encoding=enc, params={}, q_positions=pos, k_positions=pos, causal=cfg.causal,
        implementation=cfg.attention, block_q=cfg.block_size, block_k=cfg.block_size))
    runs = {"core": lambda: core(q, kv, kv),
            "attn": jitted(block.attn, lambda m, x: m(x, pos, None, None, 0)[0]),
            "mlp": jitted(block.mlp, lambda m, x: m(x)),
            "block": jitted(block, lambda m, x: m(x, pos, None, None, 0)[0]),
            "head": jitted(model, lambda m, x: m.head(m.final_norm(x)))}
    args = {"core": ()}
    seconds = {}
    for name, fn in runs.items():
        a = args.get(name, (x,))
        jax.block_until_ready(fn(*a))                                  # compiles, warms up
        seconds[name] = _median_seconds(lambda: jax.block_until_ready(fn(*a)), repeats)
    n = cfg.num_layers
    out = {"attention core": n * seconds["core"],
           "projections + rope": n * (seconds["attn"] - seconds["core"]),
           "mlp": n * seconds["mlp"],
           "norms + residuals": n * (seconds["block"] - seconds["attn"] - seconds["mlp"]),
           "head": seconds["head"]}
    out["rest"] = whole - sum(out.values())
    out["whole"] = whole
    return out


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# --- transformers (the torch worker) --------------------------------------------------------
def torch_pieces(model, ids) -> dict[str, float]:
    """{piece: seconds} of one forward of a transformers Llama-like `model` on ids [1, L]."""
    import torch  # only in the worker: torch is the bench extra's, never the package's

    acc = dict.fromkeys((*PIECES, "sdpa", "self_attn", "proj"), 0.0)
    started: dict[int, float] = {}

    def timer(module, name):
        def pre(*_):
            started[id(module)] = time.perf_counter()

        def post(*_):
            acc[name] += time.perf_counter() - started.pop(id(module))
        return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    inner = model.model
    hooks = timer(model.lm_head, "head") + timer(inner.norm, "head")
    for layer in inner.layers:
        attn = layer.self_attn
        hooks += timer(attn, "self_attn") + timer(layer.mlp, "mlp")
        hooks += timer(layer.input_layernorm, "norms + residuals")
        hooks += timer(layer.post_attention_layernorm, "norms + residuals")
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            hooks += timer(proj, "proj")
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def timed_sdpa(*args, **kwargs):
        t = time.perf_counter()
        out = sdpa(*args, **kwargs)
        acc["sdpa"] += time.perf_counter() - t
        return out
    torch.nn.functional.scaled_dot_product_attention = timed_sdpa
    try:
        t = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
        whole = time.perf_counter() - t
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        for h in hooks:
            h.remove()
    out = {"attention core": acc["sdpa"],
           "projections + rope": acc["self_attn"] - acc["sdpa"],
           "mlp": acc["mlp"], "norms + residuals": acc["norms + residuals"],
           "head": acc["head"]}
    out["rest"] = whole - sum(out.values())
    out["whole"] = whole
    out["of which projections"] = acc["proj"]
    return out


def report(length: int, ours: dict[str, float], torch: dict[str, float] | None) -> None:
    """Prints one table: seconds per piece, share of the whole, and torch s / ours s."""
    print(f"\nbreakdown at L={length} (seconds of one forward; x torch = torch s / ours s)")
    print(f"{'piece':>20} {'ours s':>8} {'share':>6} {'torch s':>8} {'share':>6} {'x torch':>8}")
    for name in (*PIECES, "whole"):
        o = ours[name]
        row = f"{name:>20} {o:>8.2f} {o / ours['whole']:>6.0%}"
        if torch is not None:
            t = torch[name]
            row += f" {t:>8.2f} {t / torch['whole']:>6.0%} {t / o if o > 0 else 0:>8.2f}"
        print(row, flush=True)

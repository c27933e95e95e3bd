"""Benchmark: `posenc_jax.encodings.rope.apply` against a port of Hugging Face's recipe and a plain copy.

RoPE is memory-bound: it reads q and k once and writes them once, so the right yardstick is a
jitted copy of the same bytes. Run from the repository root (quietest CPU you can get):

    .venv/bin/python benchmarks/rope.py              # float32 and bfloat16
    .venv/bin/python benchmarks/rope.py --variants   # also the formulations we tried
    .venv/bin/python benchmarks/rope.py --smoke      # [1, 64, 2, 16] float32, one round (CI)

Each function is jitted, warmed up, then timed in several rounds interleaved with the others
(so a burst of load from another process hits all of them); a round reports the median of
`--reps` calls and we keep each function's fastest round. Every timed call ends with
`block_until_ready`.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from posenc_jax.encodings import rope

SHAPE = (4, 2048, 16, 128)  # B, L, H, D
SMOKE_SHAPE = (1, 64, 2, 16)


# --- a direct JAX port of Hugging Face's recipe (modeling_llama / modeling_rope_utils) --------
def hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return jnp.concatenate([-x2, x1], axis=-1)


def hf_apply(q, k, positions, inv_freq):
    """cos/sin repeated to full D and cast to the activation dtype, then q*cos + rot(q)*sin."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq[None, None, :]   # [B, L, R]
    emb = jnp.concatenate([freqs, freqs], axis=-1)                               # [B, L, D]
    cos = jnp.cos(emb).astype(q.dtype)[:, :, None, :]                            # [B, L, 1, D]
    sin = jnp.sin(emb).astype(q.dtype)[:, :, None, :]
    return q * cos + hf_rotate_half(q) * sin, k * cos + hf_rotate_half(k) * sin


# --- the formulations we tried for `rope.apply_cos_sin` (half layout, full rotary) ------------
def _f32(x):
    return x.astype(jnp.float32)


def var_split_concat(x, c, s):
    """Split into halves, rotate, concatenate the halves back (the textbook form)."""
    r = c.shape[-1]
    x1, x2 = _f32(x[..., :r]), _f32(x[..., r:])
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1).astype(x.dtype)


def var_reshape_stack(x, c, s):
    """View as [..., 2, R], rotate the two rows, stack them back."""
    xr = _f32(x).reshape(*x.shape[:-1], 2, c.shape[-1])
    x1, x2 = xr[..., 0, :], xr[..., 1, :]
    return jnp.stack([x1 * c - x2 * s, x2 * c + x1 * s], -2).reshape(x.shape).astype(x.dtype)


def var_reshape_flip(x, c, s):
    """View as [..., 2, R]: x * [c; c] + flip(x) * [-s; s] (one expression, no rejoin)."""
    xr = _f32(x).reshape(*x.shape[:-1], 2, c.shape[-1])
    cc = jnp.stack([c, c], -2)
    ss = jnp.stack([-s, s], -2)
    return (xr * cc + jnp.flip(xr, -2) * ss).reshape(x.shape).astype(x.dtype)


def var_gather_astype(x, c, s):
    """Our one-pass gather form, but with plain `astype` conversions (matters for bfloat16)."""
    r = c.shape[-1]
    cc, ss = jnp.concatenate([c, c], -1), jnp.concatenate([-s, s], -1)
    partner = (np.arange(2 * r) + r) % (2 * r)
    return (_f32(x) * cc + _f32(x[..., partner]) * ss).astype(x.dtype)


def _variant(fn, inv_freq):
    def f(q, k, positions):
        cos, sin = rope.cos_sin(positions, inv_freq)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]      # [B, L, 1, R]
        return fn(q, cos, sin), fn(k, cos, sin)
    return f


def time_all(fns, args, *, rounds, reps):
    """Fastest round's median seconds per function; rounds interleave the functions."""
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    for f in jitted.values():  # compile + warm up
        for _ in range(2):
            jax.block_until_ready(f(*args))
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, f in jitted.items():
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                jax.block_until_ready(f(*args))
                times.append(time.perf_counter() - t0)
            best[name] = min(best[name], float(np.median(times)))
    return best, jitted


def run(dtype, *, rounds, reps, variants, shape=SHAPE):
    B, L, H, D = shape
    kq, kk = jax.random.split(jax.random.key(0))
    q = jax.random.normal(kq, (B, L, H, D), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (B, L, H, D), jnp.float32).astype(dtype)
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    inv_freq = rope.inv_freq(D)

    def ours(q, k, positions):
        return rope.apply(q, positions, inv_freq), rope.apply(k, positions, inv_freq)

    def ours_shared(q, k, positions):  # cos/sin once for q and k (what the attention does)
        cos, sin = rope.cos_sin(positions, inv_freq)
        return rope.apply_cos_sin(q, cos, sin), rope.apply_cos_sin(k, cos, sin)

    fns = {
        "copy (x * 1)": lambda q, k, p: (q * 1, k * 1),
        "copy (jnp.copy)": lambda q, k, p: (jnp.copy(q), jnp.copy(k)),
        "ours: rope.apply": ours,
        "ours: cos_sin once": ours_shared,
        "HF rotate_half port": lambda q, k, p: hf_apply(q, k, p, inv_freq),
    }
    if variants:
        for fn in (var_split_concat, var_reshape_stack, var_reshape_flip, var_gather_astype):
            fns[f"variant: {fn.__name__[4:]}"] = _variant(fn, inv_freq)
    best, jitted = time_all(fns, (q, k, positions), rounds=rounds, reps=reps)

    # Exactness: everything agrees with a float64 NumPy reference to float rounding.
    ref_q = np.asarray(jitted["ours: rope.apply"](q, k, positions)[0], np.float64)
    for name in fns:
        if not name.startswith("copy"):
            got = np.asarray(jitted[name](q, k, positions)[0].astype(jnp.float32), np.float64)
            assert np.allclose(got, ref_q, atol=0.05 if dtype == jnp.bfloat16 else 1e-5), name

    nbytes = 4 * q.size * q.dtype.itemsize  # read q, k and write q, k
    copy = min(best["copy (x * 1)"], best["copy (jnp.copy)"])
    print(f"\n{jnp.dtype(dtype).name} q, k [{B}, {L}, {H}, {D}]: {nbytes / 2**20:.0f} MiB moved "
          f"per call; fastest copy {copy * 1e3:.1f} ms = {nbytes / copy / 1e9:.2f} GB/s")
    for name, t in best.items():
        print(f"  {name:28s} {t * 1e3:8.1f} ms  {nbytes / t / 1e9:6.2f} GB/s  "
              f"{copy / t:6.1%} of copy bandwidth")
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--variants", action="store_true", help="also time rejected forms")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--smoke", action="store_true",
                        help=f"q, k {list(SMOKE_SHAPE)}, float32, one round of one call (CI)")
    args = parser.parse_args()
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    if args.smoke:
        args.rounds, args.reps, args.dtypes = 1, 1, "float32"
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    for name in args.dtypes.split(","):
        best = run(jnp.dtype(name), rounds=args.rounds, reps=args.reps, variants=args.variants,
                   shape=shape)
        ours = best["ours: rope.apply"]
        port = best["HF rotate_half port"]
        print(f"  => ours {ours * 1e3:.1f} ms vs HF port {port * 1e3:.1f} ms "
              f"({port / ours:.2f}x faster)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()

"""Input checks shared by every floor: one helper per kind of check, one argument order.

Every helper takes `(name, value, ...)`, raises `TypeError` for a value of the wrong type and
`ValueError` for a value of the right type that is not allowed, and names the key and the
value in the message (`"num_heads must be an int >= 1, got num_heads='4' (str)"`). Booleans
are never ints or floats here, and strings are never booleans: `causal="False"` is a
TypeError, not True.

Positions that index a table (learned absolute embeddings, T5 buckets, Shaw's clipped
relative embeddings) must be integers: a float position there is almost always a bug (an
interpolated RoPE position passed to the wrong encoder), so `integer_array` raises instead of
silently truncating it.
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

__all__ = [
    "boolean",
    "checked_token_ids",
    "finite_float",
    "integer",
    "integer_array",
    "json_count",
    "last_axis",
    "one_of",
    "pair",
    "positive_int",
    "token_ids",
    "warn",
]



def _type_name(value: Any) -> str:
    return type(value).__name__


def integer(name: str, value: Any, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """`value` as a Python int. TypeError unless an integer (bools are not); ValueError if out
    of [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {name}={value!r} ({_type_name(value)})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {name}={value}")
    return value


def positive_int(name: str, value: Any) -> int:
    """`integer(name, value, minimum=1)`."""
    return integer(name, value, minimum=1)


def json_count(name: str, value: Any) -> int:
    """`positive_int` for a count read from a JSON config, where an integral float counts as
    its int (JSON writers may emit 4096.0); 4096.5, "4096" and True stay TypeErrors, NaN a
    ValueError."""
    if isinstance(value, float) and finite_float(name, value).is_integer():
        value = int(value)
    return positive_int(name, value)


def finite_float(name: str, value: Any, *, minimum: float | None = None,
                 maximum: float | None = None, above: float | None = None,
                 below: float | None = None) -> float:
    """`value` as a finite Python float.

    TypeError unless a real number (bools and strings are not); ValueError if NaN or infinite,
    or outside the bounds: `minimum`/`maximum` inclusive, `above`/`below` exclusive.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {name}={value!r} ({_type_name(value)})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {name}={value!r}")
    if above is not None and not value > above:
        raise ValueError(f"{name} must be > {above}, got {name}={value!r}")
    if below is not None and not value < below:
        raise ValueError(f"{name} must be < {below}, got {name}={value!r}")
    return value


def boolean(name: str, value: Any) -> bool:
    """`value` as a Python bool; TypeError for anything else (`"False"` and 0 included)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {name}={value!r} "
                        f"({_type_name(value)})")
    return bool(value)


def one_of(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """`value` if it is one of `choices`; else ValueError listing the valid choices."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(repr, choices))}")
    return value


def _fits(name: str, host: np.ndarray) -> None:
    """ValueError if host integers do not fit the dtype JAX will store them in (int32 unless
    jax_enable_x64): jnp.asarray(np.int64(3_000_000_000)) is -1_294_967_296, silently."""
    if not host.size or host.dtype.kind not in "iu":
        return
    info = np.iinfo(jax.dtypes.canonicalize_dtype(host.dtype))
    if host.min() < info.min or host.max() > info.max:
        raise ValueError(f"{name} must fit in {info.dtype} (JAX would wrap them silently), got "
                         f"values in [{host.min()}, {host.max()}]")


def integer_array(name: str, value: Any):
    """`value` as a jax array; TypeError naming the dtype unless it has an integer dtype (the
    message does not say why positions must be integers: RoPE, xPos and the model's masks call
    this as well as the schemes that index a table).

    Works on concrete and traced arrays of any shape; host integers (NumPy, lists) that do not
    fit JAX's integer dtype are a ValueError.
    """
    if not isinstance(value, jax.Array):  # host data: jnp.asarray wraps int64 to int32 silently
        _fits(name, np.asarray(value))
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (positions are integers: a float "
                        f"position is not truncated here), got dtype={value.dtype}")
    return value


def float_dtype(name: str, value: Any):
    """`value` as a floating jnp.dtype (float16 / bfloat16 / float32 / float64); TypeError
    naming it for an integer, bool or complex dtype, or for what is no dtype at all."""
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype, got {value!r}") from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating dtype (float32, bfloat16, float16), got "
                        f"{name}={dtype.name}: an integer buffer would round every key and "
                        "value")
    return dtype


def prng_key(name: str, value: Any):
    """A PRNG key from `value`: a key (`jax.random.key(...)`, or a legacy uint32 [2] from
    `jax.random.PRNGKey`) as given, a Python or NumPy int as the seed of `jax.random.key`;
    TypeError naming the type otherwise (JAX's own message is "invalid PRNG key data")."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a PRNG key or an int seed, got bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return jax.random.key(int(value))
    if isinstance(value, jax.Array) and (jnp.issubdtype(value.dtype, jax.dtypes.prng_key) or (
            value.dtype == jnp.uint32 and value.shape[-1:] == (2,))):
        return value
    raise TypeError(f"{name} must be a PRNG key (jax.random.key(seed)) or an int seed, got "
                    f"{_type_name(value)} {value!r}"[:300])


def position_array(name: str, value: Any, *, floats: bool = False):
    """Positions as a jax array: integers (or, with `floats=True`, real numbers too), never
    bool (a mask passed as positions: TypeError naming the dtype); host integers that JAX
    would store wrapped (int64 past 2^31 without jax_enable_x64) are a ValueError."""
    if not isinstance(value, jax.Array):
        _fits(name, np.asarray(value))
    value = jnp.asarray(value)
    if value.dtype == jnp.bool_ or not floats:
        if value.dtype == jnp.bool_:
            raise TypeError(f"{name} must hold positions (integers), got dtype=bool: a mask "
                            "is not a position")
        return integer_array(name, value)
    if not jnp.issubdtype(value.dtype, jnp.number) or jnp.iscomplexobj(value):
        raise TypeError(f"{name} must hold integer or real positions, got dtype={value.dtype}")
    return value


def last_axis(name: str, array: Any, size: int, what: str) -> None:
    """ValueError unless `array`'s last axis has `size` entries (`what` names where the size
    comes from, e.g. "the sinusoidal encoding's embed_dim")."""
    shape = jnp.shape(array)
    if not shape or shape[-1] != size:
        raise ValueError(f"{name} must be [..., {size}] ({what}={size}), got {name} of shape "
                         f"{shape}")


def token_ids(name: str, tokens: Any, *, vocab_size: int):
    """`tokens` as an integer jax array; for concrete tokens, ValueError naming the first id
    outside [0, vocab_size) and where it is. Traced tokens cannot be checked at trace time:
    see `checked_token_ids`."""
    tokens = integer_array(name, tokens)
    if isinstance(tokens, jax.core.Tracer):
        return tokens
    host = np.asarray(tokens)
    bad = (host < 0) | (host >= vocab_size)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"token id {int(host[index])} at {name}[{', '.join(map(str, index))}]"
                         f" is outside the vocabulary [0, vocab_size={vocab_size})")
    return tokens


def checked_token_ids(name: str, tokens: Any, *, vocab_size: int):
    """`token_ids` plus, for traced tokens, a `jax.experimental.checkify` check naming the
    first bad id: call it inside a function wrapped by `checkify.checkify` (jitted or not)."""
    tokens = token_ids(name, tokens, vocab_size=vocab_size)
    if isinstance(tokens, jax.core.Tracer):
        bad = (tokens < 0) | (tokens >= vocab_size)
        first = jnp.argmax(bad.reshape(-1))
        checkify.check(~jnp.any(bad), f"token id {{}} in {name} is outside the vocabulary "
                       f"[0, vocab_size={vocab_size})", tokens.reshape(-1)[first])
    return tokens


def _in_package(frame) -> bool:
    """True for a frame of posenc_jax's code, including the __init__ that dataclasses generate
    for its schemes (file "<string>", globals of the scheme's module)."""
    module = frame.f_globals.get("__name__", "")
    return module == "posenc_jax" or module.startswith("posenc_jax.")


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn` attributed to the first frame outside posenc_jax: the user's line. A
    fixed stacklevel counts a different depth from each public entry point (validate,
    rope_kwargs_from_hf_config, rotate_like_hf, the RoPE encoding) and pointed into the
    library."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _in_package(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def pair(q_positions, k_positions):
    """q [..., Lq] and k [..., Lk] -> ([..., Lq, 1], [..., 1, Lk]) of equal rank.

    Leading dims are padded with ones on the left so that the two broadcast explicitly under
    `jax_numpy_rank_promotion='raise'` (e.g. q [B, Lq] with k [Lk]).
    """
    q = jnp.asarray(q_positions)[..., :, None]
    k = jnp.asarray(k_positions)[..., None, :]
    rank = max(q.ndim, k.ndim)
    q = q.reshape((1,) * (rank - q.ndim) + q.shape)
    k = k.reshape((1,) * (rank - k.ndim) + k.shape)
    return q, k

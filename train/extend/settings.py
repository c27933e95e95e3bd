"""The extension study's config read once into typed, frozen settings, every key checked.

    settings = read(config, inspect=checkpoint_facts)

Every key of configs/extend_smollm2.py is checked before the first job and named as typed on
the command line (`config.passkey.keys_per_depth`); a key the study does not read is an error,
not ignored. A model's context length C and rotary dim come from its checkpoint
(`checkpoint_facts`: the config.json or GGUF metadata, no tensor read); `config.model.<name>.
context` / `rotary_dim` are 0 (read them) or must equal the checkpoint's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from posenc_jax import checks, pretrained
from posenc_jax.encodings import hf_config
from posenc_jax.model import backends
from posenc_jax.model.config import TransformerConfig
from train.engine import lengths, names, scalings
from train.extend import prompts, texts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = ("models", "model", "pretrained_dir", "methods", "lengths", "texts", "passkey",
        "tolerance", "passkey_threshold", "dtype", "attention", "block_size", "scan_layers",
        "calibrate_len", "calibrate_attention_len", "scaling_overrides")
MODEL_KEYS = ("file", "context", "rotary_dim", "add_bos", "passkey_lengths")
PASSKEY_KEYS = ("enabled", "lengths", "depths", "keys_per_depth", "digits", "seed",
                "max_new_tokens")
DTYPES = ("float32", "bfloat16")
MAX_DIGITS = 18  # a key is a number below 10**digits; 18 digits fit an int64 token text
MIN_LENGTH = 2   # a forward predicts at least one token


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a checkpoint says about itself: its context length C and its rotary dim."""

    context: int
    rotary_dim: int


def checkpoint_facts(path: str) -> Facts:
    """C (max_position_embeddings) and the rotary dim of the first layer of the checkpoint
    at `path`, from its config (no tensor is read). FileNotFoundError when there is none."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    hf = pretrained.open_checkpoint(path).config
    text = hf.get("text_config") or hf
    context = checks.positive_int(f"{path}: max_position_embeddings",
                                  text.get("max_position_embeddings"))
    encoding = TransformerConfig(**hf_config.transformer_config_kwargs(hf)).layer_encoding(0)
    return Facts(context=context, rotary_dim=int(getattr(encoding, "rotary_dim", 0) or 0))


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    file: str
    path: str
    context: int
    rotary_dim: int
    add_bos: bool
    lengths: tuple[int, ...]
    passkey_lengths: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Passkey:
    enabled: bool
    depths: tuple[float, ...]
    keys: tuple[str, ...]
    digits: int
    seed: int
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class Settings:
    models: tuple[Model, ...]
    methods: tuple[str, ...]
    texts: tuple[str, ...]
    passkey: Passkey
    tolerance: float
    passkey_threshold: float
    dtype: str
    attention: str
    block_size: int
    scan_layers: bool   # the blocks as one lax.scan (same params, same results): one
    calibrate_len: int  # layer compiled, not 30; not in the job fingerprints
    calibrate_attention_len: int
    scaling_overrides: tuple[tuple[str, Any], ...]   # (method, frozen dict of keys)

    def model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)

    def overrides(self, method: str) -> dict:
        return dict(dict(self.scaling_overrides).get(method, ()))


def _known(block: Mapping, allowed, where: str) -> None:
    unknown = sorted(set(block.keys()) - set(allowed))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: the extension study has no such key "
                         f"({where}'s keys: {', '.join(allowed)})")


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a str, got {key}={value!r} ({type(value).__name__})")
    return value


def model_path(file: str, pretrained_dir: str) -> str:
    """config.model.<name>.file under config.pretrained_dir, else $POSENC_PRETRAINED_DIR,
    else <repo>/.pretrained (unless absolute)."""
    root = pretrained_dir or os.environ.get("POSENC_PRETRAINED_DIR") or os.path.join(
        ROOT, ".pretrained")
    return file if os.path.isabs(file) else os.path.join(root, file)


def _fact(key: str, given: Any, held: int, path: str, what: str) -> int:
    given = checks.integer(key, given, minimum=0)
    if given and given != held:
        raise ValueError(f"{key}={given} contradicts the checkpoint: {path} holds {what}="
                         f"{held}; leave it 0 to read it from the checkpoint")
    return held


def _model(config, name: str, inspect: Callable[[str], Facts]) -> Model:
    where = f"config.model.{name}"
    spec = config.model[name]
    _known(spec, MODEL_KEYS, where)
    file = _string(f"{where}.file", spec.get("file", ""))
    if not file:
        raise ValueError(f"{where}.file is empty: name the checkpoint (a .gguf file or a "
                         "directory with config.json)")
    path = model_path(file, _string("config.pretrained_dir", config.get("pretrained_dir", "")))
    try:
        facts = inspect(path)
    except FileNotFoundError:
        raise ValueError(f"model {name!r}: {path} does not exist (bash scripts/"
                         "fetch_pretrained.sh DIR, then --config.pretrained_dir=DIR or "
                         "POSENC_PRETRAINED_DIR=DIR)") from None
    context = _fact(f"{where}.context", spec.get("context", 0), facts.context, path,
                    "max_position_embeddings")
    rotary = _fact(f"{where}.rotary_dim", spec.get("rotary_dim", 0), facts.rotary_dim, path,
                   "a rotary dim")

    def parse(spec_: Any, key: str) -> tuple[int, ...]:
        return lengths.lengths(_string(key, spec_), base="C", value=context, key=key,
                               minimum=MIN_LENGTH)

    own = spec.get("passkey_lengths", "") or config.passkey.get("lengths", "")
    key = (f"{where}.passkey_lengths" if spec.get("passkey_lengths", "") else
           "config.passkey.lengths" if config.passkey.get("lengths", "") else "config.lengths")
    return Model(name=name, file=file, path=path, context=context, rotary_dim=rotary,
                 add_bos=checks.boolean(f"{where}.add_bos", spec.get("add_bos", False)),
                 lengths=parse(config.lengths, "config.lengths"),
                 passkey_lengths=parse(own or config.lengths, key))


def _depth(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"config.passkey.depths={spec!r}: {text.strip()!r} is not a number in "
                         "[0, 1]") from None
    return checks.finite_float("config.passkey.depths", value, minimum=0.0, maximum=1.0)


def _passkey(config) -> Passkey:
    pk = config.passkey
    _known(pk, PASSKEY_KEYS, "config.passkey")
    depths = tuple(_depth(d, pk.depths) for d in _string("config.passkey.depths",
                                                          pk.depths).split(",") if d.strip())
    digits = checks.integer("config.passkey.digits", pk.digits, minimum=1, maximum=MAX_DIGITS)
    seed = checks.integer("config.passkey.seed", pk.seed, minimum=0)
    count = checks.positive_int("config.passkey.keys_per_depth", pk.keys_per_depth)
    enabled = checks.boolean("config.passkey.enabled", pk.enabled)
    if enabled and not depths:
        raise ValueError(f"config.passkey.depths={pk.depths!r} names no depth; give depths in "
                         "[0, 1] such as '0.5' or set config.passkey.enabled=False")
    return Passkey(enabled=enabled, depths=depths,
                   keys=tuple(prompts.make_keys(count, digits=digits, seed=seed)),
                   digits=digits, seed=seed, max_new_tokens=checks.positive_int(
                       "config.passkey.max_new_tokens", pk.max_new_tokens))


def _overrides(config) -> tuple[tuple[str, Any], ...]:
    over = config.get("scaling_overrides") or {}
    out = []
    for method in list(over):
        checks.one_of("config.scaling_overrides method", method, scalings.methods())
        keys = over[method]
        items = keys.to_dict() if hasattr(keys, "to_dict") else dict(keys or {})
        out.append((method, tuple(sorted(items.items()))))
    return tuple(out)


def read(config, *, inspect: Callable[[str], Facts] = checkpoint_facts) -> Settings:
    """Checks every key of `config` (an extension ConfigDict); the frozen settings."""
    _known(config, KEYS, "config")
    model_names = names.names(_string("config.models", config.models), key="config.models",
                              valid=tuple(config.model.keys()), required=True)
    attention = _string("config.attention", config.attention)
    if attention:
        checks.one_of("config.attention", attention, (*backends.names(), backends.AUTO))
    return Settings(
        models=tuple(_model(config, n, inspect) for n in model_names),
        methods=names.names(config.methods, key="config.methods", valid=scalings.all_methods(),
                            allow_all=True, required=True),
        texts=names.names(config.texts, key="config.texts", valid=texts.TEXTS, required=True),
        passkey=_passkey(config),
        tolerance=checks.finite_float("config.tolerance", config.tolerance, above=0.0),
        passkey_threshold=checks.finite_float("config.passkey_threshold",
                                              config.passkey_threshold, above=0.0, maximum=1.0),
        dtype=checks.one_of("config.dtype", config.dtype, DTYPES), attention=attention,
        block_size=checks.integer("config.block_size", config.block_size, minimum=0),
        scan_layers=checks.boolean("config.scan_layers", config.get("scan_layers", False)),
        calibrate_len=checks.positive_int("config.calibrate_len", config.calibrate_len),
        calibrate_attention_len=checks.integer("config.calibrate_attention_len",
                                               config.get("calibrate_attention_len", 0),
                                               minimum=0),
        scaling_overrides=_overrides(config))

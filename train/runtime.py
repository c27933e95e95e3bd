"""`Runtime`: the one object that owns what a process keeps between runs.

Building a setup (model, optimizer, shardings), compiling a step and reading a split's tokens
take seconds; a study, a resumed run or a test module does each many times with the same
inputs. The builders (`state.make_setup`, `state.make_init`, `step.make_train_step`,
`step.make_eval_step`, `data.config_stream`) build anew on every call and keep nothing; a
`Runtime` remembers their results, bounded (least recently used first out), keyed on what
they depend on. Create one where a program starts (the study, the trainer, a test module),
pass it down, and drop it to free everything: importing a module keeps nothing.

    runtime = Runtime()
    setup = runtime.setup(config, mesh)                  # the same object for an equal config
    step = runtime.train_step(setup, packed=False, accum_steps=1)
    stream = runtime.stream(config.dataset, "train")
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from train import data, state
from train import step as step_lib


class _Bounded:
    """A dict that forgets its least recently used entry beyond `size` entries."""

    def __init__(self, size: int):
        self.size = size
        self._items: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = build()
        self._items[key] = value
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)


class Runtime:
    """Setups, compiled functions and token streams of one process; see the module docstring.

    Bounds: `max_setups` setups, `max_compiled` compiled functions, `max_streams` streams (a
    stream holds a whole split in memory: about 12 MB for the bundled corpus's train split).
    """

    def __init__(self, *, max_setups: int = 32, max_compiled: int = 64, max_streams: int = 8):
        self._setups = _Bounded(max_setups)
        self._compiled = _Bounded(max_compiled)
        self._streams = _Bounded(max_streams)

    def setup(self, config: Any, mesh, *, model_overrides: Mapping[str, Any] | None = None
              ) -> state.TrainSetup:
        """`state.make_setup(config, mesh, model_overrides=...)`, built once per key."""
        key = state.setup_key(config, mesh, model_overrides)
        return self._setups.get(key, lambda: state.make_setup(
            config, mesh, model_overrides=model_overrides))

    def init_state(self, setup: state.TrainSetup, *, seed: int) -> dict[str, Any]:
        """`state.init_state` with the init function compiled once per setup."""
        init = self._compiled.get((setup, "init"), lambda: state.make_init(setup))
        return state.init_state(setup, seed=seed, init=init)

    def train_step(self, setup: state.TrainSetup, *, packed: bool = False,
                   accum_steps: int = 1, chunk: int = 0) -> Callable:
        """`step.make_train_step(setup, ...)`, built once per (setup, packed, accum_steps,
        chunk)."""
        return self._compiled.get((setup, "train_step", packed, accum_steps, chunk),
                                  lambda: step_lib.make_train_step(
                                      setup, packed=packed, accum_steps=accum_steps,
                                      chunk=chunk))

    def eval_step(self, graphdef: Any, mesh, rules: tuple, *, packed: bool = False,
                  chunk: int = 0) -> Callable:
        """`step.make_eval_step(graphdef, mesh, rules, ...)`, built once per key."""
        rules = tuple(rules)
        return self._compiled.get(("eval_step", graphdef, mesh, rules, packed, chunk),
                                  lambda: step_lib.make_eval_step(graphdef, mesh, rules,
                                                                  packed=packed, chunk=chunk))

    def stream(self, dataset: Any, split: str, *, tokenizer: Any = None) -> data.TokenStream:
        """`data.config_stream(dataset, split, tokenizer=...)`, read once per (dataset block,
        split, tokenizer source)."""
        d = dataset.to_dict() if hasattr(dataset, "to_dict") else dict(dataset)
        data_dir = d.get("data_dir")
        key = (d.get("name"), split, None if data_dir is None else os.path.abspath(data_dir),
               d.get("text_key", "text"), d.get("max_tokens"),
               repr(sorted((d.get("kwargs") or {}).items())),
               None if tokenizer is None else tokenizer.source, d.get("eos_join", False))
        return self._streams.get(key, lambda: data.config_stream(dataset, split,
                                                                 tokenizer=tokenizer))

"""Attention backends as one registry (`registry.Backend` records); importing this package
registers the built-in ones, in this order: "dense", "blockwise", "pallas", "cudnn".

A new backend is one module that builds a `Backend` record and calls `register` (plus its
import below, for a built-in one). `AUTO` ("auto") is not a backend: `choose` picks one.
"""

# Registration order: the order names() lists them and errors suggest them in.
# isort: off
from posenc_jax.model.backends import dense
from posenc_jax.model.backends import blockwise
from posenc_jax.model.backends import pallas
from posenc_jax.model.backends import cudnn
# isort: on
from posenc_jax.model.backends.registry import (
    AUTO,
    PLATFORMS,
    Backend,
    Inputs,
    Shapes,
    bias_kind,
    check,
    choose,
    get,
    host_platform,
    names,
    register,
    resolve,
    run,
)

DENSE, BLOCKWISE, PALLAS, CUDNN = dense.NAME, blockwise.NAME, pallas.NAME, cudnn.NAME

__all__ = ["AUTO", "BLOCKWISE", "CUDNN", "DENSE", "PALLAS", "PLATFORMS", "Backend", "Inputs",
           "Shapes", "bias_kind", "check", "choose", "get", "host_platform", "names", "register",
           "resolve", "run"]

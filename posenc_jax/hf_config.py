"""Deprecated module path: `import posenc_jax.hf_config` (the module is
`posenc_jax.encodings.hf_config`; `from posenc_jax import hf_config` and `posenc_jax.hf_config`
after a bare `import posenc_jax` give it without a warning).

Kept for a release so that code written against the old path keeps running; it re-exports the
module's public names and warns once per import.
"""

import warnings

from posenc_jax.encodings.hf_config import *
from posenc_jax.encodings.hf_config import __all__  # noqa: F401

warnings.warn("`import posenc_jax.hf_config` is deprecated: the module is "
              "posenc_jax.encodings.hf_config (or use `from posenc_jax import hf_config`)",
              DeprecationWarning, stacklevel=2)

"""Floor 2: the model. It uses floor 1 (`posenc_jax.encodings`) only through the encoding
interface and never names an encoding.

`attention` (dense, blockwise), `config`, `transformer` (the NNX decoder LM), `kv_cache`,
`generate`, and `linen` (Linen modules over the same hooks).
"""

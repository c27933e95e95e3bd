"""Floor 2: the model. It uses floor 1 (`posenc_jax.encodings`) only through the encoding
interface and never names an encoding.

`attention` (dense, blockwise), `config`, `transformer` (the NNX decoder LM, which hands out
its hidden states and its head), `loss` (cross-entropy from those without [B, L, V] logits), `kv_cache`,
`generate`, and `linen` (Linen modules over the same hooks).
"""

"""Training for posenc-jax: data, sharded train/eval steps, checkpoints, the study.

Shape letters used throughout: B batch (B_local: the rows one process loads), L sequence
length, N number of tokens in a stream. Tokens are bytes (vocabulary 256) stored as uint8 and
handed to the model as int32.
"""

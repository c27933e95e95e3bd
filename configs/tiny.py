"""A really tiny run for tests: 2 layers, E=32, L=32, B=8, 3 steps, 60 stdlib files."""

from configs import default


def get_config():
    config = default.get_config()
    config.num_train_steps = 3
    config.batch_size = 8
    config.seq_len = 32
    config.learning_rate = 1e-2
    config.warmup_steps = 1
    config.log_every_steps = 1
    config.eval_every_steps = 0
    config.checkpoint_every_steps = 2
    config.dataset.kwargs.max_files = 60
    config.model.update(num_layers=2, embed_dim=32, num_heads=2, mlp_dim=64)
    config.eval.num_tokens = 1024
    config.eval.lengths = (32,)
    return config

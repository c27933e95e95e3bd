"""A tiny study for tests: two encodings, a few steps on 40 stdlib files, two eval lengths."""

from configs import study


def get_config():
    config = study.get_config()
    config.encodings = "rope,learned"
    config.scalings = "yarn"
    config.eval_lengths = "L,2L"
    config.eval_num_tokens = 256
    config.eval_batch_tokens = 128
    config.estimate_compile_s = 1.0
    train = config.train
    train.seq_len = 16
    train.batch_size = 8
    train.num_train_steps = 3
    train.warmup_steps = 1
    train.log_every_steps = 1
    train.checkpoint_every_steps = 3
    train.async_checkpointing = False
    train.dataset.kwargs.max_files = 40
    train.model.update(num_layers=1, embed_dim=16, num_heads=2, mlp_dim=32)
    return config

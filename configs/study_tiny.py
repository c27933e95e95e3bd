"""A tiny study for tests: two encodings, a few steps on 40 stdlib files, two eval lengths; RoPE
fine-tuned at 2L with YaRN; passkey models (a few steps) scored at L, 2L."""

from configs import study


def get_config():
    config = study.get_config()
    config.encodings = "rope,learned"
    config.workers = 1   # in the test's process (tests/study/test_study_parallel.py: 2)
    config.scalings = "yarn"
    config.finetune.scalings = "yarn"
    config.finetune.length = "2L"
    config.finetune.fraction = 0.5
    config.passkey.update(lengths="L,2L", trials=8, steps=2, batch_size=8, num_examples=200,
                          finetune_steps=1)
    config.eval_lengths = "L,2L"
    config.eval_num_tokens = 288
    config.eval_batch_tokens = 192
    config.estimate_compile_s = 1.0
    study.shrink_train_for_tests(config.train, seq_len=24)
    return config

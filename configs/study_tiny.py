"""A tiny study for tests: two encodings, a few steps on 40 stdlib files, two eval lengths; RoPE
fine-tuned at 2L with YaRN; passkey models (a few steps) scored at L, 2L. Its variants
(configs/study.py's rope-window-sinks and rope-chunk-nope, windows and chunks of L/2 = 12) and
its `longrope-searched` search (5 evaluations: population 3, one generation of 2) are what
tests/study/test_study_entries.py runs (`--config.encodings=rope-window-sinks,rope-chunk-nope
--config.scalings=longrope-searched --config.train.model.num_layers=2`: the chunk
variant has one chunked and one NoPE layer)."""

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
    config.longrope_search.update(generations=1, population=3, parents=2, mutations=1,
                                  crossovers=1, tokens=96)
    study.shrink_train_for_tests(config.train, seq_len=24)
    return config

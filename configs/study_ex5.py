"""Exercise 5 as written: sinusoidal, RoPE and ALiBi trained at L = 512, evaluated at 256, 512,
1024, 2048 and 4096 (L/2 .. 8L), for one accelerator in about 3 minutes.

    python -m train.study --config=configs/study_ex5.py --workdir=runs/ex5

A 6-layer, E = 384 (6 heads of 64) SwiGLU decoder, about 11M parameters, bfloat16 compute with
float32 params, 800 steps of 32 x 512 bytes (13.1M tokens, about one pass over the ~12 MB
training split of the bundled corpus) per encoding; RoPE also zero-shot with YaRN and NTK past L.
No fine-tuning or passkey jobs: exercise 5 asks for perplexity against length only.

Expected time -- an ESTIMATE, not a measurement: 6 x 11M x 13.1M + attention
12 x 6 x 512 x 384 x 13.1M ~= 1.1e15 FLOPs per model; a model this small is bound by step
overhead, not FLOPs, on an H200 (assumed ~25 steps/s: ~35 s per model), plus ~20 s of
compilation per model and a few seconds of evaluation: about 3 minutes for the three.
`--config=configs/study_ex5.py:smoke` is the same study shrunk to run on a CPU in
seconds (the tests run it).
"""

from configs import study
from posenc_jax.model import backends


def get_config(arg: str = ""):
    config = study.get_config()
    config.encodings = "sinusoidal,rope,alibi"
    config.scalings = "yarn,ntk"
    config.eval_lengths = "256,512,1024,2048,4096"
    config.eval_num_tokens = 65536            # 16 windows at 4096, 256 at L/2
    config.eval_batch_tokens = 65536
    config.eval_attention = backends.BLOCKWISE
    config.eval_block_size = 512
    config.max_eval_memory_gb = 40.0
    config.estimate_gflops = 50000.0          # an assumption (overhead-bound small model)
    config.estimate_compile_s = 20.0
    _disable_v2_jobs(config)

    train = config.train
    train.seq_len = 512
    train.batch_size = 32
    train.num_train_steps = 800
    train.learning_rate = 1e-3
    train.warmup_steps = 80
    train.log_every_steps = 100
    train.checkpoint_every_steps = 400
    train.checkpoints_to_keep = 1
    train.model.update(num_layers=6, embed_dim=384, num_heads=6, mlp_dim=1024,
                       dtype="bfloat16", param_dtype="float32", attention=backends.DENSE,
                       block_size=512)
    if arg == "smoke":
        shrink_for_cpu(config)
    return config


def _disable_v2_jobs(config) -> None:
    """Perplexity only: no fine-tuning, no passkey models."""
    config.finetune.scalings = ""
    config.passkey.enabled = False


def shrink_for_cpu(config) -> None:
    """The same study at a size a CPU test runs in seconds: L = 32, eval at L/2 .. 8L."""
    config.eval_lengths = "16,32,64,128,256"
    config.eval_num_tokens = 512
    config.eval_batch_tokens = 512
    config.eval_block_size = 32
    config.max_eval_memory_gb = 2.0
    config.estimate_gflops = 10.0
    config.estimate_compile_s = 1.0
    study.shrink_train_for_tests(config.train, seq_len=32)
    config.train.model.update(dtype="float32", block_size=32)

"""The length-extrapolation study at a larger scale, for one accelerator (GPU or TPU).

Trained at L = 512 like Press et al. (2022), evaluated at 256 .. 8192 (L/2 .. 16L); an 8-layer,
E = 512 (8 heads of 64) SwiGLU decoder, about 27M parameters, bfloat16 compute with float32
params, 4,000 steps of 32 x 512 tokens (65.5M tokens, about 5.5 passes over the ~12 MB
training split of the bundled corpus) per encoding.

Expected time -- an ESTIMATE from FLOPs, not a measurement: training is about
6 x 27M x 65.5M + attention 12 x 8 x 512 x 512 x 65.5M ~= 1.2e16 FLOPs per model, 8.7e16 for
the seven; evaluation (66 items over 131,072 tokens each, up to 8192 long) adds ~9e14. At an
assumed 150 TFLOP/s sustained (about 15% of an H100/H200's dense bfloat16 peak, plausible for
a model this small) that is ~10 minutes of compute, plus compilation (~1-2 minutes): about
15 minutes on one H100/H200-class GPU, several times longer on older GPUs. The printed
estimate uses the same assumption (estimate_gflops below). On this project's 2-core CPU it
would take months: use configs/study.py there.

    python -m train.study --config=configs/study_full.py --workdir=runs/study_full

Like configs/study.py it includes the two `config.variants` (windows and chunks of L/2 = 256)
and the `longrope-searched` rows: one search of 24 evaluations (each compiles once) per model
and eval length past L, on 2,048 validation tokens; not counted in the estimate above.
"""

from configs import study
from posenc_jax.model import backends


def get_config():
    config = study.with_variants_and_search(study.get_config())
    config.eval_num_tokens = 131072          # 16 windows at 16L = 8192, 512 at L/2
    config.eval_batch_tokens = 65536
    config.eval_attention = backends.BLOCKWISE  # O(L) memory at 8192 for ALiBi, T5 and Shaw
    config.eval_block_size = 512
    config.max_eval_memory_gb = 40.0
    config.estimate_gflops = 150000.0        # an assumption for an H100/H200-class GPU
    config.estimate_compile_s = 20.0
    config.encoding_kwargs.shaw.max_relative_position = 64

    train = config.train
    train.seq_len = 512
    train.batch_size = 32
    train.num_train_steps = 4000
    train.learning_rate = 1e-3
    train.warmup_steps = 200
    train.log_every_steps = 100
    train.checkpoint_every_steps = 500
    train.checkpoints_to_keep = 2
    train.model.update(num_layers=8, embed_dim=512, num_heads=8, mlp_dim=1536,
                       dtype="bfloat16", param_dtype="float32", attention=backends.DENSE,
                       block_size=512)
    return config

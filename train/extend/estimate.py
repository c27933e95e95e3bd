"""The time estimate printed before the first job, calibrated on this machine.

    cost = Cost.calibrate(model_config, forward_seconds=t, length=n, compile_s=c, load_s=l)
    cost.seconds(job)            the estimated seconds of one job

How it is calibrated: the runner loads the first model, times one forward of `calibrate_len`
tokens after its compile (and the compile, and the load), and divides the forward's FLOPs
(`forward_flops`) by that time: a rate in FLOP/s measured here and now, under this machine's
load. Every job is then its FLOPs over that rate, plus one compile and one load:

  ppl       one forward of n tokens
  passkey   per prompt, a forward of n tokens (the prefill) and `max_new_tokens` decode steps
            of one token over n cached ones; a length-dependent scaling (the registry says:
            dynamic NTK) rebuilds the whole cache at every step past C
            (`posenc_jax.model.kv_cache`), i.e. one more forward of n per step

`forward_flops` counts the matmuls: 2 x the weights touched per token (q, k, v, o, MLP, output
projection) plus causal attention's 2 L H D per token per layer (QK^T and PV over half the
keys on average: the blockwise kernel skips blocks above the diagonal). Long lengths are
dominated by that quadratic term, which the short calibration forward under-weights; the
printed estimate is a measured rate times a FLOP count, not a measurement.
"""

from __future__ import annotations

import dataclasses

from train.extend.plan import Job, PasskeyJob, PplJob


def forward_flops(mc, n: int) -> float:
    """FLOPs of one causal forward of n tokens of a TransformerConfig `mc`."""
    e, h, k, d, f = mc.embed_dim, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.mlp_dim
    mlp = (3 if mc.mlp_activation == "swiglu" else 2) * e * f
    per_token = 2.0 * (mc.num_layers * (2 * e * h * d + 2 * e * k * d + mlp) + e * mc.vocab_size)
    return n * per_token + 2.0 * mc.num_layers * h * d * float(n) * n


def decode_flops(mc, n: int) -> float:
    """FLOPs of one decode step over n cached tokens."""
    return forward_flops(mc, 1) + 4.0 * mc.num_layers * mc.num_heads * mc.head_dim * n


@dataclasses.dataclass(frozen=True)
class Cost:
    """A measured rate (FLOP/s), compile and load seconds, and the model's config."""

    flops_per_s: float
    compile_s: float
    load_s: float
    model_config: object

    @classmethod
    def calibrate(cls, model_config, *, forward_seconds: float, length: int, compile_s: float,
                  load_s: float) -> Cost:
        rate = forward_flops(model_config, length) / max(forward_seconds, 1e-9)
        return cls(flops_per_s=rate, compile_s=compile_s, load_s=load_s,
                   model_config=model_config)

    def flops(self, job: Job) -> float:
        mc, n = self.model_config, job.length
        if isinstance(job, PplJob):
            return forward_flops(mc, n)
        if isinstance(job, PasskeyJob):
            steps = job.max_new_tokens - 1
            rebuild = steps * forward_flops(mc, n) if job.length_dependent else 0.0
            return job.trials * (forward_flops(mc, n) + steps * decode_flops(mc, n) + rebuild)
        raise TypeError(f"no cost for a job of kind {job.kind!r}")

    def seconds(self, job: Job, *, loads: bool = True) -> float:
        """Estimated seconds of `job` (a compile, a load when `loads`)."""
        return (self.flops(job) / self.flops_per_s + self.compile_s
                + (self.load_s if loads else 0.0))


def total_seconds(cost: Cost, jobs) -> float:
    """The jobs' estimate in plan order, a load counted once per (model, scaling)."""
    seen, total = set(), 0.0
    for job in jobs:
        key = (job.model, job.scaling)
        total += cost.seconds(job, loads=key not in seen)
        seen.add(key)
    return total

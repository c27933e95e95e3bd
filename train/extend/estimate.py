"""The time estimate printed before the first job, calibrated on this machine.

    cost = Cost.calibrate(model_config, forward_seconds=t, length=n, compile_s=c, load_s=l,
                          attention_seconds=ta, attention_length=na)
    cost.seconds(job)            the estimated seconds of one job

How it is calibrated: the runner loads the first model, times one forward of `calibrate_len`
tokens after its compile (and the compile, and the load), and one layer's attention over
`calibrate_attention_len` tokens alone (`measure.attention_seconds`). Two rates in FLOP/s,
measured here and now under this machine's load: attention's (its FLOPs over its time) and the
weight matmuls' (their FLOPs over the rest of the forward's time). Every job is then its FLOPs
over those rates, plus its compiles and one load per scaling:

  ppl       one forward of n tokens; one compile
  passkey   per prompt, a forward of n tokens (the prefill) and `max_new_tokens` - 1 decode
            steps of one token over n cached ones; a length-dependent scaling (the registry
            says: dynamic NTK) rebuilds the whole cache at every step past C
            (`posenc_jax.model.kv_cache`), i.e. one more forward of n per step;
            `GENERATE_COMPILES` compiles (prefill with a cache + the decode scan)

The FLOP formulas are the engine's (`train.engine.flops`): the weight matmuls are 2 x the
weights touched per token (q, k, v, o, MLP, output projection); causal attention is 2 L H D per
token per layer (QK^T and PV over half the keys on average: the blockwise kernel skips blocks
above the diagonal). At
16k tokens attention is two thirds of SmolLM2's FLOPs and runs at a lower rate than the
matmuls: a single rate from a short forward (where it is 6%) under-estimated long lengths.
The printed estimate is measured rates times FLOP counts, not a measurement.
"""

from __future__ import annotations

import dataclasses

from train.engine.flops import attention_flops, decode_flops, forward_flops
from train.engine.flops import matmul_flops as linear_flops
from train.extend.plan import Job, PasskeyJob, PplJob

#: compiles of one passkey job in units of the calibration forward's compile: `generate`
#: compiles the prefill with a KV cache and the decode scan (SmolLM2 on 2 loaded cores:
#: 48 s against 17-18 s for a forward; docs/extend.md, "The estimate")
GENERATE_COMPILES = 2.5


@dataclasses.dataclass(frozen=True)
class Cost:
    """Measured rates (FLOP/s) of the weight matmuls and of attention, the compile and load
    seconds, and the model's config. `attention_flops_per_s` None: one rate for both."""

    flops_per_s: float
    compile_s: float
    load_s: float
    model_config: object
    attention_flops_per_s: float | None = None

    @classmethod
    def calibrate(cls, model_config, *, forward_seconds: float, length: int, compile_s: float,
                  load_s: float, attention_seconds: float | None = None,
                  attention_length: int = 0) -> Cost:
        """From one forward of `length` tokens taking `forward_seconds`; with
        `attention_seconds` (one layer's attention over `attention_length` tokens, timed
        alone) attention gets its own rate and the forward's remaining time sets the
        matmuls' rate (at least half the forward's time is kept for them)."""
        mc, forward_seconds = model_config, max(forward_seconds, 1e-9)
        if attention_seconds is None:
            return cls(flops_per_s=forward_flops(mc, length) / forward_seconds,
                       compile_s=compile_s, load_s=load_s, model_config=mc)
        attn = attention_flops(mc, attention_length, layers=1) / max(attention_seconds, 1e-9)
        rest = max(forward_seconds - attention_flops(mc, length) / attn, 0.5 * forward_seconds)
        return cls(flops_per_s=linear_flops(mc, length) / rest, compile_s=compile_s,
                   load_s=load_s, model_config=mc, attention_flops_per_s=attn)

    def forward_seconds(self, n: int) -> float:
        """Estimated seconds of one forward of n tokens (no compile)."""
        mc = self.model_config
        if self.attention_flops_per_s is None:
            return forward_flops(mc, n) / self.flops_per_s
        return (linear_flops(mc, n) / self.flops_per_s
                + attention_flops(mc, n) / self.attention_flops_per_s)

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
        """Estimated seconds of `job` (its compiles, a load when `loads`)."""
        mc, n = self.model_config, job.length
        if isinstance(job, PplJob):
            run, compiles = self.forward_seconds(n), 1.0
        elif isinstance(job, PasskeyJob):
            steps = job.max_new_tokens - 1
            per = (self.forward_seconds(n) * (1 + (steps if job.length_dependent else 0))
                   + steps * decode_flops(mc, n) / self.flops_per_s)
            run, compiles = job.trials * per, GENERATE_COMPILES
        else:
            raise TypeError(f"no cost for a job of kind {job.kind!r}")
        return run + compiles * self.compile_s + (self.load_s if loads else 0.0)


def job_seconds(cost: Cost, jobs) -> dict:
    """{job: estimated seconds} in plan order, a load counted once per (model, scaling)."""
    seen, out = set(), {}
    for job in jobs:
        key = (job.model, job.scaling)
        out[job] = cost.seconds(job, loads=key not in seen)
        seen.add(key)
    return out


def total_seconds(cost: Cost, jobs) -> float:
    """The jobs' estimate (`job_seconds`), summed."""
    return sum(job_seconds(cost, jobs).values())

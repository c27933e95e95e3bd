"""The context-extension study on real pretrained models (issue 22): zero-shot RoPE scaling of
SmolLM2-135M (C = 8192) and Gemma 3 270M (C = 32768), perplexity by position and passkey.

    python -m train.extend --config=configs/extend_smollm2.py --workdir=runs/ext

    settings.read(config) -> Settings         every key checked; C and rotary dim from the
                                              checkpoint's header
    plan.plan_of(settings, workdir) -> Plan     pure: the jobs (model, method, length, measure)
    runner.RUNNERS[job.kind](ctx, job)          ppl, passkey: one result row each
    report.write_all(ctx, results, timings)     report.md, ppl.csv, buckets.csv, passkey.csv,
                                                ppl_by_position_<model>.png, passkey_<model>.png

`runner.run(config, workdir, load=...)` hands the record (`runner.study()`) to the engine
(`train.engine`: store, resume, lock, SIGTERM, progress, timings). `texts` holds the stdlib
texts, `prompts` the passkey prompt, `measure` the two measurements, `estimate` the
calibrated time estimate, `table` the rows as tables and the supported-length criterion,
`figures` the plots, `readme` the README section. Importing this package imports none of them.
"""

"""The length-extrapolation study: train one model per encoding at length L, evaluate each at
L/2 ... 16L, and RoPE zero-shot with every scaling method past L.

    python -m train.study --config=configs/study.py --workdir=runs/study
    python -m train.study --config=configs/study.py --workdir=runs/study \\
        --config.encodings=rope,alibi --config.train.seed=1

A study on the engine (`train.engine`): three parts, one module each, in one record
(`runner.STUDY`):

    plan.make_plan(config, workdir) -> Plan     pure: the config checked, the jobs listed
    execute.RUNNERS[job.kind](ctx, job)         one job (train, finetune, eval, passkey)
    report.write_all(ctx, results, timings)     results.csv, report.md, extrapolation.png

`runner.run(config, workdir)` hands the record to the engine, which resumes, locks, handles
SIGTERM, estimates and, with config.workers, runs models in worker processes. `jobs` holds the
job classes, `extension` the fine-tune and passkey settings, `table` the result rows as CSV and
markdown, `figures` the plots, `aggregate` the seed statistics, `files` every path in the
workdir. Importing this package imports none of them.
"""

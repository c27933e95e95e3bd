"""The length-extrapolation study: train one model per encoding at length L, evaluate each at
L/2 ... 16L, and RoPE zero-shot with every scaling method past L.

    python -m train.study --config=configs/study.py --workdir=runs/study
    python -m train.study --config=configs/study.py --workdir=runs/study \\
        --config.encodings=rope,alibi --config.train.seed=1

Three steps, one module each:

    plan.make_plan(config, workdir) -> Plan     pure: the config checked, the jobs listed
    runner.run(config, workdir)                 runs (resumes) the jobs: in order here
                                                (`execute`), or model by model in worker
                                                processes (`parallel`, config.workers)
    report.write_all(...)                       results.csv, report.md, extrapolation.png

`jobs` holds the job classes (one per kind: train, eval), `scalings` the RoPE scaling dicts,
`table` the result rows as CSV and markdown, `plot` the figure, `files` every path in the
workdir. Importing this package imports none of them.
"""

"""One study engine: what every study needs, written once, beside thin studies.

A study is a record of pure parts (`record.Study`, as optax's `GradientTransformation` is two
functions): `plan(config, workdir)` -> a frozen plan whose `jobs` are small frozen dataclasses
(each with `kind`, `name`, `model` and `fingerprint`), a runner per job kind
(`(ctx, job) -> result`, a JSON dict), and `report(ctx, results, timings)` -> the files it
wrote. `run.run(study, config, workdir)` does everything else:

    store      one atomic JSON file per finished job, kept only with the job's fingerprint:
               a rerun skips it (resume); `timings.json`, one record per invocation
    lock       <workdir>/.lock (`train.workdir_lock`): one run per workdir
    signals    SIGTERM / Ctrl-C stop after the job in progress; the run exits 0 and resumes
    progress   one bar over the estimated seconds, never past its total
    workers    the jobs of one model per worker process (`workers`), when a study asks

and the shared vocabulary: `lengths` (the grammar 'L/2', '4C', '2*L' over named bases),
`names` (comma-separated name lists, "no scaling", the RoPE scaling methods and their
dicts), `flops` (the FLOP formulas), `output` (CSV text, figures, the machine's description).

Two studies use it: `train.study` (models trained from scratch) and `train.extend`
(pretrained models stretched zero-shot). Importing this package imports none of its modules.
"""

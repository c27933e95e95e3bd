"""The context-extension study on real pretrained models (issue 22): zero-shot RoPE scaling of
SmolLM2-135M (C = 8192) and Gemma 3 270M (C = 32768), perplexity by position and passkey.

    python -m train.extend --config=configs/extend_smollm2.py --workdir=runs/ext

    plan.make_plan(config, workdir) -> Plan    pure: the jobs (model, method, length, measure)
    runner.run(config, workdir, load=...)      runs (resumes) them, one result file each
    report.write_all(...)                      report.md, ppl.csv, buckets.csv, passkey.csv,
                                               ppl_by_position_<model>.png, passkey_<model>.png

`texts` holds the stdlib texts, `prompts` the passkey prompt, `measure` the two
measurements, `estimate` the calibrated time estimate, `table` the rows as tables and the
supported-length criterion, `figures` the plots. Importing this package imports none of them.
"""

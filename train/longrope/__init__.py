"""LongRoPE's factor search (Ding et al. 2024, arXiv:2402.13753): per-pair RoPE rescale factors
and a count of initial positions left unscaled, found by evolutionary search on perplexity.

    space.py      the candidates and their constraints; the PI / NTK / YaRN seeds
    evolve.py     mutation and crossover that keep the constraints
    search.py     the search loop for any fitness callable (`search`, `estimate`)
    progress.py   the workdir: a JSON state per generation, log.jsonl, TensorBoard
    fitness.py    perplexity at the target length of a pretrained checkpoint with candidate factors
    export.py     a candidate as a Hugging Face `rope_scaling` dict
    cli.py        `python -m train.longrope --checkpoint=... --target_length=... --text=...`
"""

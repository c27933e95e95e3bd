"""The study's report on made-up result rows: the CSV round trip, medians and min-max ranges
over seeds, supported lengths, the figures, and the "flat but cannot retrieve" finding. No
training: these are pure functions of rows (train/study/table.py, aggregate.py, figures.py)."""

import math

from train.engine.store import write_text
from train.study import aggregate, figures, table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows():
    rows = []
    for enc, ppl in (("alibi", [5.0, 4.0, 3.9]), ("learned", [5.0, 4.1, math.nan])):
        for n, p in zip((8, 16, 32), ppl):
            rows.append({"encoding": enc, "scaling": "none", "train_len": 16, "eval_len": n,
                         "loss": math.log(p), "ppl": p, "tokens": 0 if math.isnan(p) else 64,
                         "eval_seconds": 0.1, "note": "n/a (x)" if math.isnan(p) else ""})
    return rows


def test_report_table_csv_roundtrip_and_noise(tmp_path):
    rows = _rows()
    path = str(tmp_path / "r.csv")
    write_text(path, table.csv_text(rows))
    back = table.read_csv(path)
    assert [r["ppl"] for r in back if not math.isnan(r["ppl"])] == [5.0, 4.0, 3.9, 5.0, 4.1]
    assert all(r["finetune_steps"] == r["finetune_len"] == r["seed"] == 0 for r in back)
    md = aggregate.value_table(aggregate.over_seeds(back, "ppl"), train_len=16,
                               order=["learned", "alibi"])
    assert md.splitlines()[0] == "| model | 8 | 16 (= L) | 32 |"
    assert md.splitlines()[2] == "| `learned` | 5.00 | 4.10 | n/a |"
    other = [dict(r, ppl=r["ppl"] * 1.1) for r in rows]
    noise = table.noise(rows, other)
    assert "| `alibi` | +10.0% | +10.0% | +10.0% |" in noise
    assert "| `learned` | +10.0% | +10.0% | — |" in noise
    figures.perplexity_figure(str(tmp_path / "p.png"), aggregate.over_seeds(back, "ppl"),
                              train_len=16)
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def _curve(encoding, scaling, ppls, *, seed=0, steps=0, lengths=(16, 32, 64, 128)):
    return [{"encoding": encoding, "scaling": scaling, "finetune_steps": steps,
             "finetune_len": 64 if steps else 0, "seed": seed, "train_len": 16, "eval_len": n,
             "ppl": p, "loss": math.log(p)} for n, p in zip(lengths, ppls)]


def test_seeds_give_medians_and_ranges_and_supported_lengths():
    rows = (_curve("rope", "none", [4.0, 4.3, 9.0, 20.0], seed=0)
            + _curve("rope", "none", [5.0, 5.2, 5.4, 20.0], seed=1)
            + _curve("rope", "none", [4.5, 4.6, 8.0, 20.0], seed=2)
            + _curve("rope", "yarn", [4.3, 4.35, 4.9], seed=0, lengths=(32, 64, 128))
            + _curve("rope", "yarn", [4.1, 4.2, 4.3, 4.3], seed=0, steps=10))
    stats = aggregate.over_seeds(rows, "ppl")
    cell = stats[(("rope", "none", 0, 0), 32)]
    assert (cell.median, cell.low, cell.high, cell.seeds) == (4.6, 4.3, 5.2, (0, 1, 2))
    assert cell.cell() == "4.60 (4.30-5.20)" and stats[(("rope", "yarn", 0, 0), 32)].cell() \
        == "4.30"
    sup = aggregate.supported(rows, train_len=16)
    # seed 0: 4.3 <= 4.4 at 2L, 9 > 4.4 at 4L -> 2x; seed 1: 5.4 <= 5.5 -> 4x; seed 2: 2x
    assert sup[("rope", "none", 0, 0)] == aggregate.Spread(2.0, 2.0, 4.0, (0, 1, 2))
    assert sup[("rope", "yarn", 0, 0)].median == 4  # 4.9 > 4.4 at 8L; L is the identity
    assert sup[("rope", "yarn", 10, 64)].median == 8  # fine-tuned: judged against seed 0's L
    md = aggregate.supported_table(rows, train_len=16, order=["rope"],
                                   claims={"rope+yarn": "8-16x"})
    assert "| `rope+yarn` | 8-16x | 4x | 8x (ft@64, 10 steps) |" in md
    assert "| `rope` | — | 2x (2-4x) | — |" in md
    assert aggregate.supported_multiple({16: 5.0, 32: math.nan}, ref=5.0, train_len=16) == 1


def test_flat_perplexity_but_no_retrieval_is_named():
    ppl = _curve("alibi", "none", [4.0, 4.0, 4.1, 4.1]) + _curve("rope", "none", [4, 5, 9, 20])
    keys = [dict(r, accuracy=a, trials=8) for r, a in zip(
        _curve("alibi", "none", [1, 1, 1], lengths=(16, 32, 128)), (0.9, 0.3, 0.0))]
    keys += [dict(r, accuracy=a, trials=8) for r, a in zip(
        _curve("rope", "none", [1, 1, 1], lengths=(16, 32, 128)), (1.0, 0.2, 0.0))]
    md, blind = aggregate.flat_but_blind(ppl, keys, train_len=16, order=["rope", "alibi"])
    assert blind == ["alibi"]  # rope's perplexity is not flat: it is not 'blind but flat'
    assert "| `alibi` | 1.02 | 0.90 | 0.30 | 0.00 |" in md


def test_every_encoding_in_the_figures_has_its_own_colour():
    import matplotlib.colors

    from train.study import figures

    colours = [matplotlib.colors.to_hex(figures._plain_color(i)) for i in range(16)]
    assert len(set(colours)) == 16

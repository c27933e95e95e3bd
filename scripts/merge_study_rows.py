"""Merges the rows of a study run made for a few entries into the committed study results.

    python scripts/merge_study_rows.py --into=docs/study runs/study_rows/A2 runs/study_rows/B

For rows added later with the same settings and seeds (`--config.encodings=...` on the docs'
config) without rerunning the whole study: each source folder's results.csv (and passkey.csv)
rows replace the rows of `--into` with the same (encoding, scaling, fine-tune, seed, length);
the others are kept. Prints how far a replaced row moved (a retrained model of the docs' config
should not move) and the perplexity, supported-length and passkey tables of the merged rows
for the entries of the sources.
"""

from __future__ import annotations

import argparse
import math
import os

from train.engine.store import write_text
from train.study import aggregate, table


def merge(old: list[dict], new: list[dict], key: str) -> tuple[list[dict], float]:
    """(rows: old ones replaced by new ones with the same `table.row_key`, the largest
    relative change of `key` among the replaced rows)."""
    by_key = {table.row_key(r): r for r in old}
    moved = 0.0
    for r in new:
        before = by_key.get(table.row_key(r))
        if before is not None and not (math.isnan(before[key]) or math.isnan(r[key])):
            moved = max(moved, abs(r[key] - before[key]) / max(abs(before[key]), 1e-12))
        by_key[table.row_key(r)] = r
    return list(by_key.values()), moved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--into", default="docs/study")
    p.add_argument("--train_len", type=int, default=64)
    p.add_argument("sources", nargs="+", help="folders holding results.csv (and passkey.csv)")
    args = p.parse_args()
    for key, fname in (("ppl", "results.csv"), ("accuracy", "passkey.csv")):
        rows = table.read_csv(os.path.join(args.into, fname))
        added = []
        for source in args.sources:
            path = os.path.join(source, fname)
            if os.path.exists(path):
                added += table.read_csv(path)
        entries = list(dict.fromkeys(r["encoding"] for r in added))
        rows, moved = merge(rows, added, key)
        text = table.csv_text(rows) if key == "ppl" else table.passkey_csv_text(rows)
        write_text(os.path.join(args.into, fname), text)
        print(f"{fname}: {len(added)} rows merged; replaced rows moved by at most {moved:.2e}")
        mine = [r for r in rows if r["encoding"] in entries]
        if mine:
            print(aggregate.value_table(aggregate.over_seeds(mine, key), train_len=args.train_len,
                                        order=entries), "\n")
        if key == "ppl" and mine:
            print(aggregate.supported_table(mine, train_len=args.train_len, order=entries,
                                            claims={}), "\n")


if __name__ == "__main__":
    main()

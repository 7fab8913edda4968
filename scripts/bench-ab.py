#!/usr/bin/env python3
"""Joins the JSON files of scripts/bench-ab.sh into one markdown table, row by row.

    python3 scripts/bench-ab.py OUTDIR

Per row (test, size): the ratio to the better baseline under the old binary and the new one
(bandwidth: ferry GB/s over the baseline's, above 1 ferry is faster; latency: ferry's time over
the baseline's, below 1 ferry is faster), their quotient new/old, and the same for the caller's
view where the row has one (ferry's GB/s over raw cuMemcpyAsync + cuStreamSynchronize, both
through the public API's default configuration). Rows only one side has are listed with a dash.
"""
import json
import pathlib
import sys


def size(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def rows(path):
    doc = json.loads(path.read_text())
    return doc.get("commit"), {(r["test"], r["size_bytes"]): r for r in doc["results"]}


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    commits = {}
    print("| test | size | unit | old ferry | new ferry | old ratio | new ratio | new/old |"
          " old caller | new caller | new/old |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for new_file in sorted(out.glob("new.*.json"), key=lambda p: p.stat().st_mtime):
        old_file = out / ("old." + new_file.name[len("new."):])
        if not old_file.exists():
            continue
        commits["old"], old = rows(old_file)
        commits["new"], new = rows(new_file)
        for key in list(old) + [k for k in new if k not in old]:
            o, n = old.get(key), new.get(key)
            any_row = n or o
            ratio = lambda r: r and r["ratio"]
            caller = lambda r: r and r.get("caller") and r["caller"]["ratio"]
            median = lambda r: r and r["series"][0]["median"]
            q = lambda a, b: a and b and b / a
            print(f"| {key[0]} | {size(key[1])} | {any_row['unit']} | {fmt(median(o))} | "
                  f"{fmt(median(n))} | {fmt(ratio(o))} | {fmt(ratio(n))} | "
                  f"{fmt(q(ratio(o), ratio(n)))} | {fmt(caller(o))} | {fmt(caller(n))} | "
                  f"{fmt(q(caller(o), caller(n)))} |")
    print(f"\nold: {commits.get('old')}, new: {commits.get('new')}")


if __name__ == "__main__":
    main()

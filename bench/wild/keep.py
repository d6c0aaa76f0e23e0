"""Keep a sweep's hand labels in `bench/wild/labels.tsv`: locations and labels only.

    python bench/wild/keep.py SWEEP.tsv

SWEEP.tsv is what `shared/tools/sweep.py run` wrote (it holds each finding's source line and message,
third-party text that stays out of this repository). The kept file has the columns `sweep.py --seed`
reads (repository, path, line, code, label) and the labeller's reason; `dplint/codes.py` counts it.
"""

import csv
import sys
from pathlib import Path
from typing import Dict, List, Tuple

KEPT = Path(__file__).with_name("labels.tsv")
COLUMNS = ["repo", "path", "line", "code", "label", "reason"]
SEEDED = "label from the seed"  # sweep.py's note on a label it took from --seed


def _where(row: Dict[str, str]) -> Tuple[str, ...]:
    return (row["repo"], row["path"], row["line"], row["code"])


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    # A row whose label came from this file (the sweep's `--seed`) says only that: its reason is the one kept here.
    earlier: Dict[Tuple[str, ...], List[str]] = {}
    if KEPT.exists():
        with open(KEPT, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                earlier.setdefault(_where(row), []).append(row["reason"])
    with open(KEPT, "w", newline="", encoding="utf-8") as handle:
        out = csv.DictWriter(handle, COLUMNS, delimiter="\t", lineterminator="\n")
        out.writeheader()
        for row in sorted(rows, key=lambda r: (r["repo"], r["path"], int(r["line"]), r["code"])):
            reason = row.get("note") or row.get("reason", "")
            reasons = earlier.get(_where(row))
            if reason == SEEDED and reasons:
                reason = reasons.pop(0)
            out.writerow({**{key: row[key] for key in COLUMNS[:5]}, "reason": reason})
    print(f"{len(rows)} findings kept in {KEPT}, {sum(1 for r in rows if not r['label'])} without a label")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

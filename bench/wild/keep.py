"""Keep a sweep's hand labels in `bench/wild/labels.tsv`: locations and labels only.

    python bench/wild/keep.py SWEEP.tsv

SWEEP.tsv is what `shared/tools/sweep.py run` wrote (it holds each finding's source line and message,
third-party text that stays out of this repository). The kept file has the columns `sweep.py --seed`
reads (repository, path, line, code, label) and the labeller's reason; `dplint/codes.py` counts it.
"""

import csv
import sys
from pathlib import Path

KEPT = Path(__file__).with_name("labels.tsv")
COLUMNS = ["repo", "path", "line", "code", "label", "reason"]


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    with open(KEPT, "w", newline="", encoding="utf-8") as handle:
        out = csv.DictWriter(handle, COLUMNS, delimiter="\t", lineterminator="\n")
        out.writeheader()
        for row in sorted(rows, key=lambda r: (r["repo"], r["path"], int(r["line"]), r["code"])):
            out.writerow({**{key: row[key] for key in COLUMNS[:5]}, "reason": row.get("note") or row.get("reason", "")})
    print(f"{len(rows)} findings kept in {KEPT}, {sum(1 for r in rows if not r['label'])} without a label")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

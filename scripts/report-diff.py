#!/usr/bin/env python3
"""Two report.html files compared apart from times and ids.

A consolidation that changes no behaviour must leave a run's page as it
was. matplotlib names every SVG element with a random prefix and hash
(``id="c3bd120patch_1"``, ``url(#p587e839f83)``), and the page carries the
time it was built and its run directory: this rewrites those to fixed
tokens and prints a unified diff of the rest (nothing when they match).

    scripts/report-diff.py OLD_RUN/report.html NEW_RUN/report.html
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path


def normal(path: Path) -> list[str]:
    s = path.read_text().replace(str(path.parent.resolve()), "RUN")
    # the run directory as given, where it stands as a name of its own (a short one, "r", is in every other word)
    s = re.sub(rf"(?<![\w.-]){re.escape(str(path.parent))}(?![\w.-])", "RUN", s)
    for prefix in set(re.findall(r'<g id="(c[0-9a-f]+)figure_1"', s)):
        s = s.replace(prefix, "C_")
    s = re.sub(r"\bC_(?:[pm]|image)[0-9a-f]{8,}", "C_H", s)
    s = re.sub(r"\d{4}-\d{2}-\d{2}[T ][0-9:.]+( UTC)?", "DATE", s)
    return s.splitlines()


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    diff = list(difflib.unified_diff(normal(Path(sys.argv[1])), normal(Path(sys.argv[2])), lineterm="", n=0))
    print("\n".join(line[:300] for line in diff) or "the same, apart from times and ids")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""docs/performance.md's "Series and bytes per pod" table, its bytes written from the bench's
latest recorded run (docs/bench.md, "What is shipped", which `procdelta bench --output
docs/bench.md` writes): `python -m tests.tools.sizesdoc`. The series a pod are checked
against the page itself (`tests/integration/test_exposition.py`); the bytes, a real page's
weight, come from the bench alone, and `tests/unit/test_sizesdoc.py` fails while the table
does not say what this writes. A cell's words after its figures are kept."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
HEADER = "| switch | series/pod | bytes/pod | series for 110 pods | page plain / gzipped |"
_FIGURE = r"~[\d.]+ [KM]B"


def weighed(bench: str) -> dict[str, tuple[int, int, int]]:
    """The bench's "What is shipped" rows: switch → (bytes a pod, page bytes, gzipped)."""
    block = bench[bench.index("What is shipped:") :].split("```", 1)[0]
    rows = {}
    for line in block.splitlines():
        found = re.match(r"^(default|--[\w.-]+)\s+[\d.]+\s+(\d+)\s+.*\s(\d+)\s+(\d+)$", line)
        if found:
            rows[found[1]] = (int(found[2]), int(found[3]), int(found[4]))
    return rows


def kilobytes(count: int, decimals: int) -> str:
    if count >= 1_000_000:
        return f"~{count / 1e6:.1f} MB"
    return f"~{count / 1000:.{decimals}f} KB"


def switch_of(cell: str) -> str:
    """A row's switch as the bench names it: its first backticked flag, or `default`."""
    flags = re.findall(r"`([^`]+)`", cell)
    return flags[0] if flags else cell.strip()


def written(performance: str, bench: str) -> str:
    """`performance` with the table's bytes cells as the bench weighed them."""
    start = performance.index(HEADER)
    end = performance.index("\n\n", start)
    sizes = weighed(bench)
    lines = performance[start:end].split("\n")
    for k, line in enumerate(lines[2:], 2):
        cells = line.strip("|").split("|")
        size = sizes.get(switch_of(cells[0]))
        if size is None:
            continue
        per_pod, page, gzipped = size
        cells[2] = re.sub(_FIGURE, kilobytes(per_pod, 1), cells[2], count=1)
        cells[4] = re.sub(
            rf"{_FIGURE} / {_FIGURE}",
            f"{kilobytes(page, 0)} / {kilobytes(gzipped, 0)}",
            cells[4],
            count=1,
        )
        lines[k] = "|" + "|".join(cells) + "|"
    return performance[:start] + "\n".join(lines) + performance[end:]


def main() -> None:
    path = DOCS / "performance.md"
    path.write_text(written(path.read_text(), (DOCS / "bench.md").read_text()))


if __name__ == "__main__":
    main()

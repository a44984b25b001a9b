"""docs/reference.md §3's table, written from the one table of the fields
(collector/fieldtable.py): `python -m tests.tools.fieldsdoc`. `tests/unit/test_fieldtable.py`
fails while the docs' table is not the one this writes."""

from __future__ import annotations

from pathlib import Path

from collector.fieldtable import markdown_table

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
HEADER = "| field | unit | meaning | source | exit record |\n"


def documented(text: str) -> tuple[int, int]:
    """Where §3's table is in the reference's text: its first line's offset, and past its
    last line's end."""
    start = text.index(HEADER, text.index("\n## §3 "))
    return start, text.index("\n\n", start) + 1


def main() -> None:
    text = REFERENCE.read_text()
    start, end = documented(text)
    REFERENCE.write_text(text[:start] + markdown_table() + text[end:])


if __name__ == "__main__":
    main()

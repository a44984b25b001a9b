"""The map of the tests: `python -m tests.tools.testmap` prints each test file, layer by
layer, with the first sentence of what it says it holds (its module docstring). Where a new
test belongs: the layer its needs put it in (docs/development.md, "Tests"), the file whose
line names what it checks. Every test file has such a line
(tests/integration/test_docs.py holds it)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
LAYERS = ("unit", "integration", "kernel")


def first_sentence(path: Path) -> str:
    """The first sentence of a file's module docstring, on one line ("" without one)."""
    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    words = " ".join(text.split())
    match = re.match(r"(.+?\.)(\s|$)", words)
    return match.group(1) if match else words


def test_files() -> dict[str, list[Path]]:
    """Each layer's test files, by name."""
    return {layer: sorted((ROOT / "tests" / layer).glob("test_*.py")) for layer in LAYERS}


def main() -> int:
    for layer, paths in test_files().items():
        print(f"tests/{layer}/")
        for path in paths:
            print(f"  {path.name:34} {first_sentence(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's shape: no import circle, the benchmark out of the collector's import
graph, one version; its annotations checked and its lint clean."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "collector"
# Files that spell the version because a tool reads them, each written from pyproject.toml
# by deploy/generate.py (tests/integration/test_helm.py fails when one is stale).
GENERATED_WITH_VERSION = {
    "deploy/helm/procdelta/Chart.yaml",
    *(f"deploy/{name}" for name in ("daemonset.yaml", "service.yaml", "serviceaccount.yaml",
                                    "servicemonitor.yaml", "prometheusrule.yaml")),
}  # fmt: skip


def _module(dotted: str) -> bool:
    """Whether `collector.<dotted>` is a module of the package (a file, or a subpackage)."""
    path = PACKAGE.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports() -> dict[str, set[str]]:
    """collector module → the collector modules it imports, anywhere in its body; a
    subpackage's modules by their dotted names below `collector` (`bench.floor`), its
    `__init__.py` by the subpackage's (`bench`)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if len(parts) > 1 and parts[-1] == "__init__" else parts)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "collector":
                found |= {alias.name for alias in node.names if _module(alias.name)}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("collector."):
                module = node.module.removeprefix("collector.")
                for alias in node.names:  # a submodule, or a name of the module
                    submodule = f"{module}.{alias.name}"
                    found.add(submodule if _module(submodule) else module)
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.removeprefix("collector.")
                    for a in node.names
                    if a.name.startswith("collector.")
                }
        graph[name] = found - {name}
    return graph


def test_no_module_imports_itself_back():
    graph = imports()
    assert graph["bench"] and graph["bench.report"] and graph["cli"]  # it sees imports at all

    def cycle_from(start: str, node: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for child in sorted(graph.get(node, ())):
            if child == start:
                return (*seen, child)
            if child not in seen:
                found = cycle_from(start, child, (*seen, child))
                if found:
                    return found
        return None

    cycles = [cycle_from(name, name, (name,)) for name in sorted(graph)]
    assert [c for c in cycles if c] == []


def without_psutil(*lines: str) -> subprocess.CompletedProcess:
    """Python lines run in a fresh interpreter where `import psutil` fails."""
    code = "\n".join(("import sys; sys.modules['psutil'] = None", *lines))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_the_collector_never_loads_the_benchmark_or_psutil():
    """What `serve` and `once` import."""
    result = without_psutil(
        "import collector.cli, collector.exporter, collector.output, collector.webconfig",
        "print(sorted({'collector.bench', 'collector.synthetic'} & set(sys.modules)))",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_pass_loop_loads_no_web_layer():
    """What `once --format prometheus` imports to render the page: the pass loop, not the
    HTTP app, its listener, TLS or the web configuration."""
    web = {"collector.exporter", "collector.listener", "collector.http11", "collector.tls",
           "collector.webconfig"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c",
         f"import sys, collector.passloop; print(sorted(set({sorted(web)!r}) & set(sys.modules)))"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_each_file_of_the_bench_is_read_at_one_sitting():
    """collector/bench/ is split by concern: no file of it over 300 lines."""
    lines = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("bench/*.py")}
    assert "__init__.py" in lines and len(lines) > 5, lines
    assert {name: n for name, n in lines.items() if n > 300} == {}


def test_bench_without_psutil_says_which_extra_in_one_line():
    result = without_psutil("from collector.cli import main", "main(['bench', '--quick'])")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "procdelta[bench]" in result.stderr and "psutil" in result.stderr


def test_the_version_is_spelled_once():
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    tracked = subprocess.run(
        ["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.split()
    spelled = {
        name
        for name in tracked
        if (ROOT / name).is_file() and version in (ROOT / name).read_text(errors="replace")
    }
    # CHANGELOG.md names each release by its version.
    assert spelled == {"pyproject.toml", "CHANGELOG.md", *GENERATED_WITH_VERSION}


def test_the_annotations_check():
    """mypy over collector/ at `[tool.mypy]`'s strictness: a wrong annotation fails here,
    not in a reader's head."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert result.stdout.startswith("Success: no issues found in ")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=" ".join)
def test_the_tree_is_ruff_clean(command):
    """`ruff check` and `ruff format --check` over the repository at `[tool.ruff]`'s rules:
    what docs/development.md says every commit is, run where CI runs the tests."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_each_mutant_of_the_catalogue_finds_its_code():
    """`python -m tests.tools.mutation` edits the code by its text: each original snippet must be
    in its file exactly once and each edit compile, or the catalogue has rotted under a
    change (its own run refuses to start then; this says so at once)."""
    from tests.tools.mutation import MUTANTS, problems_in

    assert problems_in(MUTANTS, ROOT) == []


def test_every_module_is_mutated_or_named_as_not():
    """mutmut mutates each module of collector/ not in `[tool.mutmut] do_not_mutate`: the
    modules it mutates are the ones docs/development.md names ("Mutation testing"), so a
    new module is never mutated, or left out, unsaid."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    left_out = set(config["do_not_mutate"])
    modules = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    assert left_out <= modules, left_out - modules
    mutated = {
        "top/" if path.startswith("collector/top/") else path.removeprefix("collector/")
        for path in modules - left_out
    }
    guide = (ROOT / "docs" / "development.md").read_text()
    said = guide.split("## Mutation testing", 1)[1].split("(`[tool.mutmut]`", 1)[0]
    said = said.split("Beside it, mutmut mutates", 1)[1]
    assert mutated == set(re.findall(r"`(?:collector/)?([\w/]+(?:\.py|/))`", said))


def test_tests_make_readings_one_way():
    """Every test builds a `ProcessReading` or `ThreadReading` through tests/readings.py,
    keyword-only: a field added to either is added there once."""
    calls = re.compile(r"\b(ProcessReading|ThreadReading)\(")
    builders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in (ROOT / "tests").rglob("*.py")
        if path.name != "readings.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line) and not line.lstrip().startswith(("class ", "def ", "#"))
    ]
    assert builders == []

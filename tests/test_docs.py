"""docs/reference.md against the code: every metric family with its type, every flag;
and docs/findings.md's Alertmanager inhibition against the alerts' labels.

The reference is written by hand for people; these tests keep it from drifting: a family
or a flag added, renamed or dropped in the code and not in the document (or the other way
round) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from collector.cli import cli, run_once
from collector.exporter import PassLoop
from tests.fixturetree import FixtureRun

ROOT = Path(__file__).parent.parent
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def section(number: int) -> str:
    start = REFERENCE.index(f"\n## §{number} ")
    end = REFERENCE.find("\n## §", start + 1)
    return REFERENCE[start : end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every table in the text (a header is the row above `| ---`)."""
    lines = text.splitlines()
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line, below in zip(lines, [*lines[1:], ""], strict=True)
        if line.startswith("| ") and not line.startswith("| ---") and not below.startswith("| ---")
    ]


def field_names(number: int) -> list[str]:
    """The fields a section's table names (first column, each backticked name)."""
    return [name for row in table_rows(section(number)) for name in re.findall(r"`(\w+)`", row[0])]


def documented_families() -> dict[str, str]:
    """{family: type} from §5's two tables, `<field>` rows expanded with §3's and §7's."""
    fields, cgroup_fields = field_names(3), field_names(7)
    families = {}
    for row in table_rows(section(5)):
        pattern, kind = re.findall(r"`([\w<>]+)`", row[0])[0], row[1]
        if "<field>" not in pattern:
            families[pattern] = kind
            continue
        names = cgroup_fields if "§7" in row[0] else fields
        if "but `processes`" in row[0]:
            names = [n for n in names if n != "processes"]
        for name in names:
            families[pattern.replace("<field>", name)] = kind
    return families


def rendered_families() -> dict[str, str]:
    """{family: type} of the fixture node's page, every source reported."""
    run = FixtureRun()
    sources = dict.fromkeys(
        ("schedstat", "thread_io", "cgroup_v2", "cgroup_v1_cpu", "cgroup_v1_cpuacct", "psi"), True
    )
    loop = PassLoop(run.engine, interval=10.0, monotonic=lambda: 5.0, sources=sources)
    run_once(run.engine, 10.0, run.sleep, run_pass=loop.run_pass)
    text = loop.snapshot().text.decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_reference_tables_parse():
    assert len(field_names(3)) == 11 and len(field_names(7)) == 10


def test_every_metric_family_is_documented_with_its_type():
    assert documented_families() == rendered_families()


def test_every_flag_is_documented_with_its_commands():
    documented: dict[str, set[str]] = {}
    for row in table_rows(section(6)):
        commands = {c.strip() for c in row[1].split(",")}
        for flag in re.findall(r"`(--[\w.-]+)`", row[0]):
            documented[flag] = commands
    actual: dict[str, set[str]] = {}
    for name, command in cli.commands.items():
        for param in command.params:
            for flag in (*param.opts, *param.secondary_opts):
                if flag.startswith("--") and flag != "--help":
                    actual.setdefault(flag, set()).add(name)
    assert documented == actual


def test_docstrings_cite_the_reference_not_a_missing_spec():
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [*(ROOT / "collector").glob("*.py"), *(ROOT / "tests").glob("*.py")]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b", line) and path.name != "test_docs.py"
    ]
    assert cited == []


def test_readme_module_table_names_every_module():
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `collector/")]
    named = {name for row in rows for name in re.findall(r"`(?:collector/)?(\w+)\.py`", row)}
    modules = {p.stem for p in (ROOT / "collector").glob("*.py")} - {"__init__", "__main__"}
    assert named == modules


def test_the_inhibition_example_matches_the_alerts_labels():
    """docs/findings.md's Alertmanager inhibition: each workload alert silences the pod
    alert of the same finding, on labels both carry (as the promtool tests show them)."""
    import yaml

    text = (ROOT / "docs" / "findings.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b]
    rules = yaml.safe_load(block)["inhibit_rules"]
    matcher = re.compile(r'^alertname = "(\w+)"$')
    pairs = {
        matcher.match(rule["source_matchers"][0])[1]: matcher.match(rule["target_matchers"][0])[1]
        for rule in rules
    }
    assert pairs == {
        "ProcdeltaWorkloadCPUStarved": "ProcdeltaPodCPUStarved",
        "ProcdeltaWorkloadCPUThrottled": "ProcdeltaPodCPUThrottled",
    }
    fired: dict[str, list[set[str]]] = {}
    tests = ROOT / "deploy" / "prometheus" / "procdelta.workload.rules.test.yml"
    for case in yaml.safe_load(tests.read_text())["tests"]:
        for test in case.get("alert_rule_test", []):
            for alert in test["exp_alerts"]:
                fired.setdefault(test["alertname"], []).append(set(alert["exp_labels"]))
    for rule in rules:
        assert set(rule) == {"source_matchers", "target_matchers", "equal"}
        for name in {*pairs, *pairs.values()}:
            assert fired[name], f"no promtool test raises {name}"
            for labels in fired[name]:
                assert set(rule["equal"]) <= labels, (name, labels)

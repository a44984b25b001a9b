"""The documents against the code and against each other.

docs/reference.md: every metric family with its type, every flag. The README, CHANGELOG.md,
docs/*.md and the chart's README: every relative link and anchor resolves, every doc is in
the README's table, every flag and `procdelta_*` family they name exists, the README stays
short, and docs/operating.md groups the flags as `--help` does. docs/findings.md's
Alertmanager inhibition against the alerts' labels. Written by hand for people;
these tests keep them from drifting.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from collector.cli import cli, run_once
from collector.model import CGROUP_FIELD_NAMES, FIELD_NAMES
from collector.passloop import PassLoop
from tests.exitrecords import QueuedListener
from tests.fixturetree import FixtureRun

ROOT = Path(__file__).parents[2]
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
    """{family: type} of the fixture node's page, every source reported, the node's CPUs
    counted."""
    run = FixtureRun()
    run.engine.exits = QueuedListener()  # --collector.exits: its families too
    run.engine.exits.lost[200] = 1  # one record lost, so that its family has a sample
    sources = dict.fromkeys(
        ("schedstat", "thread_io", "cgroup_v2", "cgroup_v1_cpu", "cgroup_v1_cpuacct", "psi"), True
    )
    loop = PassLoop(
        run.engine, interval=10.0, monotonic=lambda: 5.0, sources=sources, cpus=lambda: 2
    )
    run_once(run.engine, 10.0, run.sleep, run_pass=loop.run_pass)
    text = loop.snapshot().text.decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_reference_tables_parse():
    """§3's and §7's tables name the model's fields, in its order."""
    assert field_names(3) == list(FIELD_NAMES)
    assert field_names(7) == list(CGROUP_FIELD_NAMES)


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
        for path in [*(ROOT / "collector").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b", line) and path.name != "test_docs.py"
    ]
    assert cited == []


def test_module_table_names_every_module():
    development = (ROOT / "docs" / "development.md").read_text()
    rows = [line for line in development.splitlines() if line.startswith("| `collector/")]
    named = set()
    for row in rows:  # `collector/bench/memory.py`, `latency.py`: the second in bench/ too
        directory = ""
        for path in re.findall(r"`([\w/]+\.py)`", row.split("|")[1]):
            if path.startswith("collector/"):
                path = path.removeprefix("collector/")
                directory = path.rpartition("/")[0]
            elif directory:
                path = f"{directory}/{path}"
            named.add(path)
    package = ROOT / "collector"
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert named == modules - {"__init__.py", "__main__.py"}


DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "deploy" / "helm" / "procdelta" / "README.md",
    ]
)
README_MAX_LINES = 250
# Flags of other tools that the documents show in their commands; every other `--flag`
# they name must be one of procdelta's.
OTHER_TOOLS_FLAGS = {
    "--build-arg",  # docker build
    "--cascade",  # kubectl delete
    "--cgroup",  # unshare
    "--check",  # ruff format
    "--cpus",  # podman run
    "--cap-add",  # podman run
    "--network",  # podman run
    "--pid",  # podman run
    "--field-selector",  # kubectl get
    "--namespace",  # helm install
    "--now",  # systemctl enable
    "--previous",  # kubectl logs
    "--set",  # helm install
    "--update-golden",  # this project's pytest option (tests/conftest.py)
    "--baseline",  # python -m tests.tools.rulecost
    "--evaluation-interval",  # python -m tests.tools.rulecost
    "--nodes",  # python -m tests.tools.rulecost
    "--pods",  # python -m tests.tools.rulecost
    "--rules",  # python -m tests.tools.rulecost
    "--sleepers",  # python -m tests.tools.viewflood
    "--clients",  # python -m tests.tools.viewflood
    "--path",  # python -m tests.tools.viewflood
    "--nice",  # python -m tests.tools.viewflood
    "--max-children",  # mutmut run
    "--rates",  # python -m collector.bench.exitcost
    "--passes",  # python -m collector.bench.exitcost
    "--processes",  # python -m collector.bench.exitcost
    "--fork-every",  # python -m collector.bench.exitcost
}


def prose(text: str) -> str:
    """The text without its fenced code blocks (their lines blanked, numbering kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces
    as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The targets of the Markdown links of a file's prose (inline code left out)."""
    text = re.sub(r"`[^`\n]*`", "", prose(path.read_text()))
    return re.findall(r"\]\(([^)\s]+)\)", text)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no such anchor")
    return broken


def test_slugs_are_githubs():
    assert slug("§2 The cache and the delta rules") == "2-the-cache-and-the-delta-rules"
    assert slug("Throttled or contended: why run delay includes throttling") == (
        "throttled-or-contended-why-run-delay-includes-throttling"
    )
    assert slug("Layout of `collector/`") == "layout-of-collector"
    assert slug("Series and bytes per pod") == "series-and-bytes-per-pod"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n### Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1", "notes-2"}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def test_the_documents_have_links():
    assert all(links(path) for path in DOCS if path.name != "bench.md")


def test_broken_links_are_found(tmp_path):
    (tmp_path / "there.md").write_text("## Here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[a](there.md#here) [b](missing.md) [c](there.md#gone) [d](#top) [e](https://x.y)\n"
        "`[f](inline-code.md)`\n```\n[g](fenced.md)\n```\n# Top\n"
    )
    assert broken_links(page) == ["missing.md: no such file", "there.md#gone: no such anchor"]


def test_readme_links_every_doc():
    readme_links = {
        (ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")
    }
    docs = {path.resolve() for path in (ROOT / "docs").glob("*.md")}
    assert docs - readme_links == set()
    assert (ROOT / "CHANGELOG.md").resolve() in readme_links


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines"


def named_flags(text: str) -> set[str]:
    """Every `--flag` a text names, `--[no-]x` as both `--x` and `--no-x`."""
    flags = set()
    for negatable, name in re.findall(r"(?<![\w-])--(\[no-\])?([a-z][\w.-]*\w)(?![\w.>-])", text):
        flags.add(f"--{name}")
        if negatable:
            flags.add(f"--no-{name}")
    return flags


def cli_flags() -> set[str]:
    flags = {"--help", "--version"}
    for command in cli.commands.values():
        for param in command.params:
            flags |= {f for f in (*param.opts, *param.secondary_opts) if f.startswith("--")}
    return flags


def test_named_flags_expand_negatable_forms():
    assert named_flags("`--[no-]export.totals`, `--per-container`, --dash a --arrow--> b") == {
        "--export.totals",
        "--no-export.totals",
        "--per-container",
        "--dash",
    }


TOP_FLAGS = {
    "--from", "--from.username", "--from.password-file", "--from.ca-file",
    "--from.cert-file", "--from.key-file", "--from.insecure-skip-verify",
    "--pod", "--cgroup", "--sort", "--limit", "--threads", "--format", "--interval",
}  # fmt: skip
"""The flags of `procdelta top` that docs/reference.md §8 promises. Until the command is in
the CLI the documents may name them as its; from then on, the CLI's own are checked."""


def pending_commands() -> dict[str, set[str]]:
    """{command: its flags} of the commands the documents describe that the CLI lacks yet."""
    return {} if "top" in cli.commands else {"top": TOP_FLAGS}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_named_exists(path):
    pending = set().union(*pending_commands().values())
    assert named_flags(path.read_text()) - cli_flags() - pending - OTHER_TOOLS_FLAGS == set()


def test_the_reference_names_every_flag_top_takes():
    """§8 names each flag `procdelta top` is promised, and the command, once in the CLI,
    takes each of them."""
    assert TOP_FLAGS - named_flags(section(8)) == set()
    if "top" in cli.commands:
        params = cli.commands["top"].params
        assert TOP_FLAGS - {f for p in params for f in (*p.opts, *p.secondary_opts)} == set()


def code(text: str) -> list[str]:
    """The text's code: each inline code span and each line of its fenced blocks."""
    spans = re.findall(r"`([^`\n]+)`", prose(text))
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.strip())
    return spans + lines


def commands_named(text: str) -> set[str]:
    """The `procdelta` commands a text's code runs (`procdelta once`, `$ procdelta serve`,
    `kubectl exec ... -- procdelta top`)."""
    command = re.compile(r"(?:^|\$ |-- |/bin/|&& )procdelta ([a-z]+)\b")
    return {name for chunk in code(text) for name in command.findall(chunk)}


def test_commands_named_are_found_in_code_only():
    text = (
        "procdelta reads /proc; `procdelta once`\n"
        "```\n$ procdelta serve\nkubectl -n procdelta exec x -- procdelta top\n```\n"
    )
    assert commands_named(text) == {"once", "serve", "top"}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_named_exists(path):
    assert commands_named(path.read_text()) - set(cli.commands) - set(pending_commands()) == set()


def test_the_alert_to_process_command_finds_procdeltas_pod():
    """docs/findings.md's one command, against the rendered manifests of deploy/: the
    namespace and a label of the DaemonSet's pods select procdelta's pod on the node, and
    `--from` is its port on the pod's loopback."""
    import yaml

    text = (ROOT / "docs" / "findings.md").read_text()
    (line,) = [c for c in code(text) if c.startswith("kubectl ") and "procdelta top" in c]
    outer = shlex.split(line)
    (target,) = [word for word in outer if word.startswith("$(")]
    inner = shlex.split(target.removeprefix("$(").removesuffix(")"))
    daemonset = yaml.safe_load((ROOT / "deploy" / "daemonset.yaml").read_text())
    namespace = daemonset["metadata"]["namespace"]
    pod = daemonset["spec"]["template"]
    assert outer[:4] == ["kubectl", "-n", namespace, "exec"]
    assert inner[:5] == ["kubectl", "-n", namespace, "get", "pod"]
    selector = dict(label.split("=") for label in inner[inner.index("-l") + 1].split(","))
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert inner[inner.index("--field-selector") + 1] == "spec.nodeName=NODE"
    assert inner[-2:] == ["-o", "name"]
    command = outer[outer.index("--") + 1 :]
    assert command[:2] == ["procdelta", "top"]
    (container,) = pod["spec"]["containers"]
    (port,) = [p["containerPort"] for p in container["ports"]]
    assert command[command.index("--from") + 1] == f"http://127.0.0.1:{port}"
    assert command[command.index("--pod") + 1] == "NAMESPACE/POD"
    flags = {word for word in command if word.startswith("--")}
    assert flags - cli_flags() - set().union(*pending_commands().values()) == set()


FAMILY = re.compile(r"(?<![\w:])procdelta_[a-z0-9_]*[a-z0-9](?![\w:<])")


def known_families() -> set[str]:
    families = set()
    for name, kind in rendered_families().items():
        families.add(name)
        if kind == "histogram":
            families |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return families


def test_family_pattern_skips_templates_and_rules():
    text = (
        "`procdelta_interval_<field>` `procdelta_<field>_total` `procdelta_{cpu,io}_x:r` "
        "`namespace:procdelta_cores_used:rate5m` `procdelta_cpu_coverage:ratio_rate5m` "
        "`procdelta_passes_total` `procdelta_dropped_deltas_total{reason}`"
    )
    assert FAMILY.findall(text) == ["procdelta_passes_total", "procdelta_dropped_deltas_total"]


def test_every_family_named_exists():
    known = known_families()
    named = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in DOCS
        for name in FAMILY.findall(path.read_text())
        if name not in known
    }
    assert named == set()


def operating_flag_groups() -> list[tuple[str, set[str]]]:
    """docs/operating.md's "## Flags": each `###` heading and the flags named under it."""
    text = (ROOT / "docs" / "operating.md").read_text()
    start = text.index("\n## Flags\n")
    end = text.index("\n## ", start + 1)
    parts = re.split(r"^### (.+)$", text[start:end], flags=re.M)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return [(title, named_flags(body)) for title, body in pairs]


@pytest.mark.parametrize("name", ["serve", "once"])
def test_operating_groups_the_flags_as_help_does(name):
    """Each option group of the command, in its order, is a heading of docs/operating.md's
    flags in the same order, naming that group's flags (a switch by either form)."""
    documented = operating_flag_groups()
    order = [title for title, _ in documented]
    groups = cli.commands[name].option_groups
    titles = [group.title for group in groups]
    assert [t for t in order if t in titles] == titles
    for group in groups:
        flags = dict(documented)[group.title]
        for option in group.options:
            forms = {*option.opts, *option.secondary_opts}
            assert forms & flags, f"{group.title}: {option.opts[0]} not in docs/operating.md"


def test_the_inhibition_example_matches_the_alerts_labels():
    """docs/findings.md's Alertmanager inhibition: each workload alert silences the pod
    alerts of the same finding and the same workload, and no other, on the labels the alerts
    carry in the promtool tests of deploy/prometheus/procdelta.workload.rules.test.yml and
    procdelta.owed.rules.test.yml; the starved workload's alert silences its alert of
    bursts too. Alertmanager compares `equal` labels as strings, a label an alert lacks as
    empty."""
    import yaml

    text = (ROOT / "docs" / "findings.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b]
    rules = yaml.safe_load(block)["inhibit_rules"]
    matcher = re.compile(r'^alertname = "(\w+)"$')
    pairs = {
        (matcher.match(rule["source_matchers"][0])[1], matcher.match(rule["target_matchers"][0])[1])
        for rule in rules
    }
    assert pairs == {
        ("ProcdeltaWorkloadCPUStarved", "ProcdeltaPodCPUStarved"),
        ("ProcdeltaWorkloadCPUThrottled", "ProcdeltaPodCPUThrottled"),
        ("ProcdeltaWorkloadCPUStarved", "ProcdeltaWorkloadCPUStarvedOften"),
    }
    # the alerts firing together: (case, eval_time) -> alertname -> [labels]
    firing: dict[tuple[str, str], dict[str, list[dict[str, str]]]] = {}
    cases = [
        case
        for name in ("procdelta.workload.rules.test.yml", "procdelta.owed.rules.test.yml")
        for case in yaml.safe_load((ROOT / "deploy" / "prometheus" / name).read_text())["tests"]
    ]
    for case in cases:
        for test in case.get("alert_rule_test", []):
            alerts = firing.setdefault((case["name"], test["eval_time"]), {})
            labels = [{k: str(v) for k, v in a["exp_labels"].items()} for a in test["exp_alerts"]]
            alerts.setdefault(test["alertname"], []).extend(labels)
    silenced, spared, carried = 0, 0, set()
    for rule in rules:
        assert set(rule) == {"source_matchers", "target_matchers", "equal"}
        source_name = matcher.match(rule["source_matchers"][0])[1]
        target_name = matcher.match(rule["target_matchers"][0])[1]
        for alerts in firing.values():
            sources = alerts.get(source_name, [])
            for target in alerts.get(target_name, []):
                # the pod's workload alert: the one whose every label but severity it shares
                own = [
                    s
                    for s in sources
                    if all(target.get(k) == v for k, v in s.items() if k != "severity")
                ]
                inhibited = [
                    s
                    for s in sources
                    if all(s.get(k, "") == target.get(k, "") for k in rule["equal"])
                ]
                assert inhibited == own, (rule["equal"], target, sources)
                silenced, spared = silenced + bool(own), spared + (not own)
                for source in sources:
                    carried |= {k for k in rule["equal"] if k in source and k in target}
    # the tests show pods silenced and pods spared, and every label compared on both sides
    assert silenced and spared
    assert carried == {k for rule in rules for k in rule["equal"]}


def test_every_reason_and_source_the_code_defines_is_in_the_reference():
    """The reasons a delta is withheld (processes, threads, cgroups) and the sources the
    node is probed for, each backticked in reference.md §5's row of its family, and the
    troubleshooting page says what to do about each."""
    from collector import sources
    from collector.cgroupfs import detect
    from collector.model import (
        CGROUP_REFUSAL_REASONS,
        EXIT_OUTCOMES,
        REFUSAL_REASONS,
        THREAD_REFUSAL_REASONS,
    )

    rows = {
        names[0]: row[-1]
        for row in table_rows(section(5))
        if (names := re.findall(r"`(\w+)`", row[0]))
    }
    process_reasons = set(
        re.findall(r"`(\w+)`", section(2) + rows["procdelta_dropped_deltas_total"])
    )
    assert set(REFUSAL_REASONS) <= process_reasons
    assert set(THREAD_REFUSAL_REASONS) <= process_reasons
    assert set(CGROUP_REFUSAL_REASONS) <= set(
        re.findall(r"`(\w+)`", rows["procdelta_dropped_cgroup_deltas_total"])
    )
    probed = {
        *sources.probe_procfs("/proc"),
        *sources.probe_cgroups(detect("/sys/fs/cgroup")),
        "cgroup_namespace_root",  # collector/wiring.py node_sources
        "exits",  # the same, with --collector.exits
    }
    assert probed == set(re.findall(r"`(\w+)`", rows["procdelta_source_available"])) - {"source"}
    outcomes = set(re.findall(r"`(\w+)`", rows["procdelta_exit_records_total"]))
    assert {*EXIT_OUTCOMES, "dropped"} <= outcomes
    troubleshooting = (ROOT / "docs" / "troubleshooting.md").read_text()
    for name in (*REFUSAL_REASONS, *CGROUP_REFUSAL_REASONS, *probed):
        assert f"`{name}`" in troubleshooting, name


def test_the_readme_gives_two_set_up_commands_and_ci_runs_the_second():
    """The README's set-up block: exactly two commands, each under a comment saying what it
    does; the first runs procdelta from a venv it makes, the second is what CI runs."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set up", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.strip().splitlines()
    comments = [line for line in lines if line.startswith("#")]
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == 2 and len(comments) == 2
    assert "python3 -m venv .venv" in commands[0]
    assert commands[0].endswith(".venv/bin/procdelta once")
    assert commands[1] == "bash .ci/run"
    script = (ROOT / ".ci" / "run").read_text()
    assert script.rstrip().endswith('python -m pytest "${targets[@]}"')


def test_the_ci_scripts_named_targets_are_the_layers_of_tests():
    """`bash .ci/run unit` (integration, kernel): one layer of tests/, each named in the
    script's header, and every layer a target; with no target, every layer, as CI runs."""
    script = (ROOT / ".ci" / "run").read_text()
    layers = sorted(p.name for p in (ROOT / "tests").iterdir() if (p / "__init__.py").exists())
    assert layers == ["integration", "kernel", "tools", "unit"]
    (case,) = [line.strip() for line in script.splitlines() if 'targets+=("tests/$target")' in line]
    assert case == 'unit | integration | kernel) targets+=("tests/$target") ;;'
    for layer in ("unit", "integration", "kernel"):
        assert f"#   bash .ci/run {layer} " in script
    assert "#   bash .ci/run              every layer, as CI runs it" in script


# The figures of what procdelta costs live in docs/performance.md (from docs/bench.md, the
# bench's run; docs/design.md keeps how they were measured and older runs). Anywhere else a
# series-per-pod count or a memory figure of the served process is a second copy that
# drifts: the other documents, the chart's values and templates, and the manifests rendered
# from them (their comments) link to performance.md instead.
FIGURES_HOME = {"docs/performance.md", "docs/bench.md", "docs/design.md"}
FIGURE_FILES = sorted(
    {
        *(path.relative_to(ROOT).as_posix() for path in DOCS),
        "deploy/helm/procdelta/values.yaml",
        *(p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").glob("*.yaml")),
        *(
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "deploy/helm/procdelta/templates").glob("*")
        ),
        *(p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy/systemd").glob("*")),
    }
    - FIGURES_HOME
)
FIGURE_PATTERNS = {
    # a count of series: "70 series", "5,500 series", "12,500 more recorded series"
    "series": re.compile(r"\d[\d,.]*\s+(?:[\w-]+\s+){0,2}?series\b", re.I),
    # a count per pod or container: "50 per pod", "44 series per container"
    "per pod": re.compile(r"\d[\d,.]*\s+(?:series\s+)?(?:per|a|each)\s+(?:pod|container)\b", re.I),
    # "series per pod: 50", "series/pod 50"
    "series per pod": re.compile(
        r"\bseries\s*(?:/|per\s|a\s|each\s)\s*(?:pod|container)\W{1,6}\d", re.I
    ),
    # a memory figure: "near 35 MB RSS", "stays near 30 MiB"
    "memory": re.compile(r"\d[\d.,]*\s*(?:MB|MiB|GB|GiB)\b"),
}
FIGURES_ALLOWED = {
    ("docs/deploy.md", "213 MB"): "the image's size on disk, not memory",
    ("docs/deploy.md", "151 MB"): "the image's base, on disk",
    ("docs/deploy.md", "18 MB"): "the image's share for pyOpenSSL and cryptography, on disk",
    ("docs/deploy.md", "13 MB"): "the image's share for rich and its dependencies, on disk",
    ("docs/deploy.md", "58 MiB"): "the listener under a flood of 16,000 idle connections",
    ("docs/deploy.md", "25 MiB"): "what the same flood added to the RSS at rest",
    ("docs/deploy.md", "1 MiB"): "the largest web configuration file read, not memory",
    ("docs/operating.md", "1 MiB"): "the largest web configuration file read, not memory",
    ("docs/deploy.md", "32 MiB"): "the exit records' socket buffer, the kernel's memory",
}


def figures(text: str) -> list[str]:
    """The series-per-pod counts and memory figures a text quotes (line breaks as spaces)."""
    flat = re.sub(r"\s+", " ", text)
    return [m.group(0) for p in FIGURE_PATTERNS.values() for m in p.finditer(flat)]


def test_figures_are_found():
    quoted = [
        "the process stays near 35 MB RSS.",
        "so a pod of two containers ships 70 series\nagainst 50",
        "44 per container (+ the pause's)",
        "after 20 passes (RSS ~30 MiB against 64 MiB requested)",
        "series/pod 50",
        "5,500 series is the budget",
    ]
    assert [bool(figures(text)) for text in quoted] == [True] * len(quoted)
    not_quoted = [
        "memory: 64Mi",
        "one series per pod that procdelta saw",
        "`procdelta_footprint_rss_bytes`",
        "every series would be scraped twice",
        "MemoryMax=256M",
        "a 105 KB gzipped page",
    ]
    assert [figures(text) for text in not_quoted] == [[]] * len(not_quoted)


def test_series_and_memory_figures_live_in_performance_md():
    """Only docs/performance.md (and bench.md and design.md behind it) quotes series per
    pod or the served process's memory; every other document links there."""
    quoted = {
        (name, figure) for name in FIGURE_FILES for figure in figures((ROOT / name).read_text())
    }
    assert quoted - FIGURES_ALLOWED.keys() == set()
    assert FIGURES_ALLOWED.keys() - quoted == set(), "an allowed figure no longer quoted"


def test_the_golden_update_command_names_every_golden_test():
    """Each of docs/development.md's commands that rewrite the goldens names every test
    file that takes `--update-golden` (a test asking for its fixture), and only those."""
    guide = (ROOT / "docs" / "development.md").read_text()
    commands = re.findall(r"`python -m pytest ([^`]*) --update-golden`", guide)
    writers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"def test_\w+\([^)]*\bupdate_golden\b", path.read_text())
    }
    assert commands and all(set(command.split()) == writers for command in commands)


def test_every_test_file_says_what_it_holds():
    """`python -m tests.tools.testmap` is the guide's map of the tests: each test file of
    each layer opens with a sentence of what it holds (its module docstring)."""
    from tests.tools.testmap import first_sentence, test_files

    unsaid = [
        path.relative_to(ROOT).as_posix()
        for paths in test_files().values()
        for path in paths
        if len(first_sentence(path).split()) < 3
    ]
    assert unsaid == []
    assert sum(map(len, test_files().values())) == len(list((ROOT / "tests").rglob("test_*.py")))

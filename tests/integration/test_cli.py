"""The command line as a user meets it: a real process, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from collector.cli import cli
from tests.fixturetree import CONTAINER_LOGS, PASS1, POD_LOGS
from tests.spec import CGROUP_FIELDS, FIELDS


def procdelta(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(
    result: subprocess.CompletedProcess, *words: str, status: int = 2
) -> None:
    """One line on stderr holding `words`, nothing on stdout, and the exit status: 2 for a
    wrong invocation (the default), 1 for work that could not be done."""
    assert result.returncode == status, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--path.procfs", "/nonexistent"], ["--path.procfs", "/nonexistent"]),
        (["--path.procfs", str(POD_LOGS)], ["not a proc filesystem"]),
        (["--interval", "0"], ["--interval", "> 0"]),
        (["--interval", "-3"], ["--interval"]),
        (["--interval", "soon"], ["--interval"]),
        (["--interval", "inf"], ["--interval", "want 0.01 to 86400 seconds, got inf"]),
        (["--interval", "nan"], ["--interval"]),
        (["--interval", "1e-9"], ["--interval", "want 0.01 to 86400 seconds"]),
        (["--interval", "1e6"], ["--interval", "want 0.01 to 86400 seconds"]),
        (["--format", "xml"], ["--format"]),
        (["--log.level", "loud"], ["--log.level"]),
    ],
)
def test_bad_input_is_one_clear_line(args, words):
    assert_one_line_error(procdelta("once", *args), *words)


def test_unknown_command_is_one_clear_line():
    assert_one_line_error(procdelta("twice"), "twice")


def test_an_empty_directory_is_not_a_proc_filesystem(tmp_path):
    (tmp_path / "notes").mkdir()
    assert_one_line_error(procdelta("once", "--path.procfs", str(tmp_path)), "not a proc")


def test_options_from_the_environment():
    result = procdelta(
        "once",
        "--format",
        "json",
        env={
            "PROCDELTA_INTERVAL": "0.01",
            "PROCDELTA_PATH_PROCFS": str(PASS1),
            "PROCDELTA_PATH_POD_LOGS": str(POD_LOGS),
            "PROCDELTA_PATH_CONTAINER_LOGS": str(CONTAINER_LOGS),
            "PROCDELTA_PODS_ONLY": "true",
        },
    )
    assert result.returncode == 0, result.stderr
    groups = [row["group"] for row in json.loads(result.stdout)["groups"]]
    assert groups and all("uid" in group for group in groups)
    assert {"namespace": "shop", "pod": "cart-7d9f"} in [
        {"namespace": g["namespace"], "pod": g["pod"]} for g in groups
    ]


def test_env_interval_is_validated_too():
    result = procdelta("once", env={"PROCDELTA_INTERVAL": "0"})
    assert_one_line_error(result, "PROCDELTA_INTERVAL (for --interval)", "> 0")
    typed = procdelta("once", "--interval", "0", env={"PROCDELTA_INTERVAL": "1"})
    assert_one_line_error(typed, "--interval: must be > 0")
    assert "PROCDELTA_INTERVAL" not in typed.stderr


def test_bare_procdelta_prints_its_usage():
    result = procdelta()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Usage: procdelta") and "serve" in result.stdout


def test_switch_defaults_read_on_or_off():
    text = " ".join(procdelta("once", "--help").stdout.split())
    assert "PROCDELTA_COLLECTOR_CGROUP; default: (on)]" in text
    assert "PROCDELTA_PODS_ONLY; default: (off)]" in text
    assert "default: collector.cgroup" not in text


def test_once_on_this_machine_prints_every_field():
    result = procdelta("once", "--interval", "0.2", "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert list(document) == ["interval_seconds", "timestamp", "groups"]
    assert 0.2 <= document["interval_seconds"] < 5
    assert abs(document["timestamp"] - time.time()) < 30
    rows = document["groups"]
    assert rows, "this machine has processes, so at least one group"
    for row in rows:
        assert list(row) == ["group", *FIELDS, *CGROUP_FIELDS]
        assert all(isinstance(row[f], int) and row[f] >= 0 for f in FIELDS)
        assert all(row[f] is None or row[f] >= 0 for f in CGROUP_FIELDS)


def test_without_the_cgroup_collector_json_has_the_process_fields_only():
    result = procdelta("once", "--interval", "0.2", "--format", "json", "--no-collector.cgroup")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["groups"]
    assert rows and all(list(row) == ["group", *FIELDS] for row in rows)
    env = procdelta(
        "once", "--interval", "0.2", "--format", "json", env={"PROCDELTA_COLLECTOR_CGROUP": "false"}
    )
    assert env.returncode == 0, env.stderr
    assert all(list(row) == ["group", *FIELDS] for row in json.loads(env.stdout)["groups"])


def test_without_pressure_no_pressure_field_and_no_source_for_it():
    """`--no-collector.cgroup.pressure` on a host with PSI: the pressure fields have no
    series, and no source is said missing for it (it once failed here, reading the PSI
    source it had just left out)."""
    result = procdelta(
        "once", "--interval", "0.2", "--format", "prometheus", "--no-collector.cgroup.pressure"
    )
    assert result.returncode == 0, result.stderr
    assert "pressure" not in result.stderr
    samples = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert samples and not [line for line in samples if "_pressure_" in line]


def test_both_export_shapes_off_is_refused():
    result = procdelta("once", "--no-export.interval-gauges", "--no-export.totals")
    assert_one_line_error(result, "keep one of them")


def test_table_is_the_default_and_fits_80_columns():
    result = procdelta("once", "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = ["GROUP", "PROCS", "ON-CPU", "RUN-DELAY", "CGROUP-CPU", "THR-PERIODS"]
    assert lines[1].split() == header
    assert max(len(line) for line in lines) <= 80, result.stdout
    plain = procdelta("once", "--interval", "0.2", "--no-collector.cgroup").stdout.splitlines()
    assert max(len(line) for line in plain) <= 80
    assert plain[1].split()[-2:] == ["READ", "WRITE"]
    wide = procdelta("once", "--interval", "0.2", "--wide").stdout.splitlines()
    assert wide[1].split()[:4] == ["GROUP", "PROCS", "OBSERVED", "ON-CPU"]
    assert wide[1].split()[-1] == "CPU-WAIT"


@pytest.mark.root
def test_refused_processes_are_said_on_stderr_in_every_format():
    """Without root's privileges (uid 0 with every capability dropped, as
    tests/kernel/test_reliability.py runs serve) most processes refuse `io`: one line says how
    many and what to grant, whatever the output format."""
    for output_format in ("table", "json", "prometheus"):
        result = subprocess.run(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-all",
             sys.executable, "-m", "collector", "once", "--interval", "0.1",
             "--format", output_format],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (line,) = [line for line in result.stderr.splitlines() if "refused a read" in line]
        assert "processes refused" in line and "SYS_PTRACE" in line and "run as root" in line


def test_help_and_version():
    assert procdelta("--help").returncode == 0
    version = procdelta("--version")
    assert version.returncode == 0 and "procdelta" in version.stdout


SHARED_GROUPS = ["Paths", "Collectors", "Export", "Groups", "Logging"]
HELP_GROUPS = {
    "serve": ["Passes", "Web", *SHARED_GROUPS],
    "once": ["Passes", "Output", *SHARED_GROUPS],
    "top": ["Passes", "Source", "View", "Output", *SHARED_GROUPS],
    "bench": ["Measurement", "Report"],
}


def help_sections(text: str) -> dict[str, list[str]]:
    """{heading: the flags listed under it} of a command's --help, in order."""
    sections: dict[str, list[str]] = {}
    heading = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":") and "Usage" not in line:
            heading = line[:-1]
            sections[heading] = []
        elif heading and line.startswith("  -"):
            sections[heading] += re.findall(r"(?<![\w-])(-{1,2}[\w.-]+)", line.split("  ")[1])
    return sections


@pytest.mark.parametrize("command", sorted(HELP_GROUPS))
def test_help_groups_every_option_under_a_heading(command):
    """`procdelta COMMAND --help`: the groups of docs/operating.md, in its order, each
    option under one of them; only --help under "Other options"."""
    result = procdelta(command, "--help")
    assert result.returncode == 0, result.stderr
    sections = help_sections(result.stdout)
    assert list(sections) == [*HELP_GROUPS[command], "Other options"]
    assert sections["Other options"] == ["-h", "--help"]
    listed = [flag for flags in sections.values() for flag in flags]
    params = cli.commands[command].params
    flags = [f for p in params for f in (*p.opts, *p.secondary_opts) if f.startswith("--")]
    assert sorted(listed) == sorted([*flags, "-h", "--help"])


def test_each_command_says_what_it_is_for_in_one_line():
    """The top-level help lists each command with its docstring's first line, whole."""
    result = procdelta("--help")
    for name, command in cli.commands.items():
        first = command.help.splitlines()[0]
        assert first.endswith("."), first
        assert re.search(rf"^  {name}\s+{re.escape(first)}$", result.stdout, re.M), result.stdout


def test_missing_sources_are_said_once_at_start_and_exported(tmp_path):
    """An empty --path.cgroupfs: one line saying every cgroup field will be absent and
    why, and procdelta_source_available at 0 for each hierarchy."""
    result = procdelta(
        "once", "--interval", "0.1", "--format", "prometheus", "--path.cgroupfs", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    missing = [line for line in result.stderr.splitlines() if "cgroup" in line]
    assert len(missing) == 1 and "no cgroup hierarchy found under" in missing[0]
    assert "every cgroup field" in missing[0] and "Traceback" not in result.stderr
    for source in ("cgroup_v2", "cgroup_v1_cpu", "cgroup_v1_cpuacct", "psi"):
        assert f'procdelta_source_available{{source="{source}"}} 0' in result.stdout
    assert 'procdelta_source_available{source="schedstat"} 1' in result.stdout
    # run in the host's cgroup namespace: every path is the host's as read
    assert 'procdelta_source_available{source="cgroup_namespace_root"} 1' in result.stdout


def test_a_v1_host_is_told_why_pressure_is_absent():
    from tests.cgroupfixture import LAYOUTS, CgroupTree

    tree = CgroupTree(LAYOUTS["v1"])
    result = procdelta(
        "once", "--interval", "0.1", "--format", "prometheus", "--path.cgroupfs", str(tree.root)
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "pressure" in line]
    assert "no cgroup v2 tree" in line and "PSI is v2 only" in line
    assert 'procdelta_source_available{source="cgroup_v1_cpu"} 1' in result.stdout
    assert 'procdelta_source_available{source="psi"} 0' in result.stdout

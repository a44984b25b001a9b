"""The fixture proc tree after two scripted passes, its `once` output compared whole.

Rewrite the golden files after an intended change with `python -m pytest
tests/test_golden.py --update-golden`, and review the diff.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector import output
from collector.cli import cli, run_once
from tests.fixturetree import CONTAINER_LOGS, PASS1, POD_LOGS, FixtureRun
from tests.spec import FIELDS

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / name
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with --update-golden"
    assert text == path.read_text()


@pytest.mark.parametrize(
    ("name", "per_container"), [("once.json", False), ("once-per-container.json", True)]
)
def test_once_json_golden(name, per_container, update_golden):
    run = FixtureRun(per_container=per_container)
    result = run_once(run.engine, 10.0, run.sleep)
    check_golden(name, output.as_json(result) + "\n", update_golden)


def test_once_table_golden(update_golden):
    run = FixtureRun()
    check_golden(
        "once.txt", output.as_table(run_once(run.engine, 10.0, run.sleep)) + "\n", update_golden
    )


def test_fixture_pass_counts_every_refusal_reason():
    run = FixtureRun()
    result = run_once(run.engine, 10.0, run.sleep)
    assert dict(result.dropped) == {
        "first_seen": 0,
        "vanished": 0,
        "pid_reused": 1,  # 501
        "counter_fell": 1,  # 1000
        "unreadable": 2,  # 400 (io), 800 (stat)
    }
    # 1100 contributes, but its thread 1101's write_bytes fell: that thread adds nothing.
    assert dict(result.dropped_threads) == {"first_seen": 0, "pid_reused": 0, "counter_fell": 1}
    assert result.interval_ns == 10 * 10**9


def test_pods_only_drops_cgroup_groups():
    run = FixtureRun(pods_only=True)
    result = run_once(run.engine, 10.0, run.sleep)
    kinds = {group.kind for group in result.intervals}
    assert kinds == {"pod"}


def test_cli_once_json_over_the_fixture_tree():
    """The installed command over a static tree: every group, all eleven fields, no deltas."""
    runner = CliRunner()
    args = [
        "once",
        "--format",
        "json",
        "--interval",
        "0.01",
        "--path.procfs",
        str(PASS1),
        "--path.pod-logs",
        str(POD_LOGS),
        "--path.container-logs",
        str(CONTAINER_LOGS),
    ]
    result = runner.invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and [list(row) for row in rows] == [["group", *FIELDS]] * len(rows)
    groups = {json.dumps(row["group"], sort_keys=True) for row in rows}
    assert json.dumps({"cgroup": "/system.slice/odd.service"}) in groups
    for row in rows:
        assert row["observed_nanos"] > 0
        assert all(row[f] == 0 for f in list(row)[3:]), row

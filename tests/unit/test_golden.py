"""The fixture proc tree after two scripted passes, its `once` output compared whole.

Rewrite the golden files after an intended change with `python -m pytest
tests/unit/test_golden.py --update-golden`, and review the diff.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector import output
from collector.cli import cli, run_once
from tests.cgroupfixture import MAIN, CgroupTree
from tests.fixturetree import CONTAINER_LOGS, PASS1, POD_LOGS, FixtureRun
from tests.spec import CGROUP_FIELDS, FIELDS

GOLDEN = Path(__file__).parents[1] / "golden"


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


@pytest.mark.parametrize(("name", "wide"), [("once.txt", False), ("once-wide.txt", True)])
def test_once_table_golden(name, wide, update_golden):
    run = FixtureRun()
    table = output.as_table(run_once(run.engine, 10.0, run.sleep), wide=wide)
    assert wide or max(map(len, table.splitlines())) <= 80
    check_golden(name, table + "\n", update_golden)


def test_fixture_pass_counts_every_refusal_reason():
    run = FixtureRun()
    result = run_once(run.engine, 10.0, run.sleep)
    assert dict(result.dropped) == {
        "first_seen": 0,
        "vanished": 0,
        "pid_reused": 1,  # 501
        "counter_fell": 1,  # 1000
        "unreadable": 2,  # 400 (io), 800 (stat)
        "unplaced": 0,
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
    """The installed command over a static tree: every group, every field, no deltas."""
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
    tree = CgroupTree(MAIN)  # stays at its first pass: nothing moves
    result = runner.invoke(cli, [*args, "--path.cgroupfs", str(tree.root)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["groups"]
    assert rows and [list(row) for row in rows] == [["group", *FIELDS, *CGROUP_FIELDS]] * len(rows)
    groups = {json.dumps(row["group"], sort_keys=True) for row in rows}
    assert json.dumps({"cgroup": "/system.slice/odd.service"}) in groups
    for row in rows:
        if row["processes"]:
            assert row["observed_nanos"] > 0
            assert all(row[f] == 0 for f in FIELDS[2:]), row
        else:  # a pod seen only through its cgroup
            assert row["group"]["uid"] and row["cgroup_cpu_nanos"] == 0, row
        assert all(row[f] in (0, None) for f in CGROUP_FIELDS), row
    by_name = {row["group"].get("pod") or row["group"].get("cgroup"): row for row in rows}
    assert by_name["cart-7d9f"]["cpu_periods"] == 0  # v1: throttling read, nothing moved
    assert by_name["cart-7d9f"]["cpu_pressure_waiting_nanos"] is None  # no PSI on v1
    assert by_name["/system.slice/odd.service"]["cpu_pressure_waiting_nanos"] == 0


def test_cgroup_fields_of_each_fixture_group_derived_by_hand():
    """Each §7 field of the fixture's groups, from the numbers written in
    tests/cgroupfixture.py (pass 2 minus pass 1), not from a file the code wrote."""
    run = FixtureRun()
    result = run_once(run.engine, 10.0, run.sleep)
    by_name = {
        (group.label_dict().get("pod") or group.label_dict().get("uid") or group.labels[0][1]): c
        for group, c in result.cgroup_intervals.items()
    }
    sec = 10**9
    cart = by_name["cart-7d9f"]  # v1 only: cpuacct.usage, the container's quota, no PSI
    assert cart.cgroup_cpu_nanos == 2_500_000_000
    assert (cart.cpu_periods, cart.cpu_throttled_periods) == (100, 100)
    assert cart.cpu_throttled_nanos == 8 * sec
    assert cart.cpu_pressure_waiting_nanos is None and cart.io_pressure_stalled_nanos is None
    nginx = by_name["nginx-0"]  # v2 usage and PSI, v1 bandwidth of pod + container summed
    assert nginx.cgroup_cpu_nanos == 2 * sec
    assert (nginx.cpu_periods, nginx.cpu_throttled_periods) == (100 + 100, 5)
    assert nginx.cpu_throttled_nanos == 20_000_000
    assert (nginx.cpu_pressure_waiting_nanos, nginx.cpu_pressure_stalled_nanos) == (
        250_000_000,
        100_000_000,
    )
    assert nginx.io_pressure_waiting_nanos is None  # its io.pressure is missing
    etcd = by_name["etcd-node1"]  # found from another cgroup namespace's path
    assert etcd.cgroup_cpu_nanos == 5 * sec and etcd.cpu_periods is None
    assert (etcd.io_pressure_waiting_nanos, etcd.io_pressure_stalled_nanos) == (sec, sec // 2)
    odd = by_name["/system.slice/odd.service"]
    assert odd.cgroup_cpu_nanos == sec // 2 and odd.cpu_pressure_waiting_nanos == 1_000_000
    assert "deadbeef-0000-4000-8000-00000000cafe" not in by_name  # its usage fell
    assert "/" not in by_name  # the root's counters are the whole machine's
    assert dict(result.dropped_cgroups) == {"first_seen": 1, "recreated": 0, "counter_fell": 1}
    # the cgroup fields never change the process fields: the same sums as without them
    plain = FixtureRun(cgroups=False)
    assert dict(run_once(plain.engine, 10.0, plain.sleep).intervals) == dict(result.intervals)


MS, SEC = 10**6, 10**9
# Each group's process fields, from the fixture files (pass 2 minus pass 1; hz 100, so a
# tick is 10 ms; pass 1 lists at 1000 s, pass 2 reads at 1010 s):
# field order processes, on_cpu, run_delay, user, system, majflt, vol, invol, read, write
BY_HAND = {
    # PID 200: utime 8 -> 88, stime 1 -> 8, majflt 3 -> 5; threads 200 (+400 ms on a CPU,
    # +30 ms delay, +2/+9 switches), 201 (+390 ms, +25 ms, +0/+20, +1 MiB written) and
    # 203, born at 1003 s (its whole 120 ms, 5 ms, 1/12). PID 600 exited: nothing.
    "shop/cart-7d9f": (1, 910 * MS, 60 * MS, 800 * MS, 70 * MS, 2, 3, 41, 0, 1_048_576),
    # PID 300: utime 1 -> 2; thread 300 +1 ms, +50 µs, +100 voluntary; thread 302 exited.
    "web/nginx-0": (1, 1 * MS, 50_000, 10 * MS, 0, 0, 100, 0, 0, 0),
    # PID 700, born at 1007 s: whole counters of threads 700 and 701.
    "kube-system/etcd-node1": (1, 300 * MS, 5 * MS, 250 * MS, 50 * MS, 0, 90, 10, 4096, 12288),
    # PID 100 (+2 ms, +5 µs, +3/+1, 4 KiB written; 1 tick each of user and system) and
    # PID 500, reused by a cron job born at 1005 s (whole: 30 ms, 1 ms, 4/2, 64 KiB read);
    # 400 (io malformed), 800 (stat malformed) and 501 (reused, started before 1000 s):
    # nothing.
    "/system.slice/odd.service": (2, 32 * MS, 1_005_000, 30 * MS, 20 * MS, 0, 7, 3, 65536, 4096),
    # PID 950 (+3 ms, +30 voluntary, 1 tick user); PID 900 is CRI-O's conmon, not the pod's.
    "pod deadbeef": (1, 3 * MS, 0, 10 * MS, 0, 0, 30, 0, 0, 0),
    # PID 1100: thread 1100 +1 ms, +5 voluntary; thread 1101's write_bytes fell (nothing);
    # PID 1000's majflt fell 9 -> 0: the whole process dropped.
    "/": (1, 1 * MS, 0, 10 * MS, 0, 0, 5, 0, 0, 0),
    # conmon, PID 900: +100 µs, +1 voluntary.
    "conmon": (1, 100_000, 0, 0, 0, 0, 1, 0, 0, 0),
}
OBSERVED = {"kube-system/etcd-node1": 3 * SEC, "/system.slice/odd.service": 15 * SEC}


def _name(group) -> str:
    labels = group.label_dict()
    if group.kind == "pod":
        return f"{labels['namespace']}/{labels['pod']}" if labels["pod"] else "pod deadbeef"
    return "conmon" if "crio-conmon" in labels["cgroup"] else labels["cgroup"]


def test_process_fields_of_each_fixture_group_derived_by_hand():
    """The process sums of every group, from the numbers in tests/fixtures/proc (not from
    a file the code wrote)."""
    run = FixtureRun()
    result = run_once(run.engine, 10.0, run.sleep)
    got = {_name(group): fields for group, fields in result.intervals.items()}
    assert set(got) == set(BY_HAND)
    for name, expected in BY_HAND.items():
        fields = got[name]
        assert (
            fields.processes, fields.on_cpu_nanos, fields.run_delay_nanos, fields.cpu_user_nanos,
            fields.cpu_system_nanos, fields.major_faults, fields.voluntary_switches,
            fields.nonvoluntary_switches, fields.read_bytes, fields.write_bytes,
        ) == expected, name  # fmt: skip
        # each reading is 1 µs of the scripted clock after the last: within a millisecond
        assert abs(fields.observed_nanos - OBSERVED.get(name, 10 * SEC)) < MS, name


def test_a_table_shows_a_names_terminal_controls_as_question_marks():
    """Whoever may make a cgroup names it: an escape sequence in its name reaches the
    table as `?`, never the operator's terminal as a command."""
    from collector.engine import PassResult
    from collector.groups import Group
    from collector.model import Fields

    group = Group("cgroup", (("cgroup", "/evil\x1b]0;owned\x07\x9b2J"),))
    result = PassResult(
        number=2, listed_at_ns=0, interval_ns=10**9, duration_seconds=0.0, finished_at=0.0,
        intervals={group: Fields(processes=1, on_cpu_nanos=10**6)}, footprints={}, totals={},
        dropped={}, dropped_threads={}, tracked_processes=1, tracked_threads=1, denied=0,
    )  # fmt: skip
    table = output.as_table(result)
    assert "/evil?]0;owned??2J" in table
    assert not any(c in table for c in "\x1b\x07\x9b")

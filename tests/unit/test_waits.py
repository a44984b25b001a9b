"""The run delay split by cause (collector/waits.py): a table of intervals whose causes
are known, the bounds every split keeps, and `/proc/stat` read as psutil reads it."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.groups import Group
from collector.model import CgroupFields, Fields, Malformed
from collector.sources import node_cpu
from collector.waits import (
    NodeCPU,
    NodeInterval,
    node_interval,
    parse_node_cpu,
    split_cpu_stall,
    split_run_delay,
    throttled_wall_ns,
    with_waits,
)

S = 1_000_000_000  # a second in ns


def cgroup(throttled: float | None = 0, usage: float | None = None) -> CgroupFields:
    return CgroupFields(
        cgroup_cpu_nanos=None if usage is None else int(usage * S),
        cpu_throttled_nanos=None if throttled is None else int(throttled * S),
    )


@pytest.mark.parametrize(
    ("case", "on_cpu", "delay", "cgroup_fields", "node", "expected"),
    [
        # one busy thread under a 20% quota; a neighbour uses half a CPU of two: its wait
        # is its quota's, whatever the neighbour does
        ("at its quota", 0.2, 0.8, cgroup(0.8, 0.2), (2, 1, 0.7), (0.8, 0, 0)),
        # docs/reference.md §7's measurement: 4 busy threads on 2 CPUs under a 1-CPU quota
        # for 3 s: run delay 9.0 s, throttled 3.0 s; the other 6 s are its own threads'
        ("4 threads, 2 CPUs, 1-CPU quota", 3, 9, cgroup(3, 3), (2, 3, 3.05), (3, 6, 0)),
        # three busy threads alone on two CPUs, no quota: one of them always waits
        ("alone, 3 threads on 2 CPUs", 2, 1, cgroup(None, 2), (2, 1, 2.05), (0, 1, 0)),
        # the same, where the rest of the node used 0.05 s: its few ms of wake-up latency
        # beyond its own threads may be theirs, never more than they used
        ("alone, some latency", 1.9, 1.2, cgroup(None), (2, 1, 1.95), (0, 1.1, 0.05)),
        # one thread, a busier neighbour holds the CPUs: every wait is the neighbour's
        ("crowded", 0.2, 0.8, cgroup(0, 0.2), (2, 1, 2), (0, 0, 0.8)),
        # one thread waited 0.8 s, yet the rest of the node used 0.1 s of CPU: no more than
        # that is the neighbours'
        ("neighbours idle", 0.2, 0.8, cgroup(0, 0.2), (2, 1, 0.3), (0, 0, 0.1)),
        # a pod of short-lived processes: its own CPU is its cgroup's (exited ones
        # included), not only what the sums saw
        ("own CPU from the cgroup", 0.1, 0.5, cgroup(0, 1.5), (2, 1, 1.6), (0, 0, 0.1)),
        # a pod whose pod-level and container-level quotas both throttled: the throttled
        # time summed over both never counts more than the run delay
        ("throttled twice", 0.2, 0.8, cgroup(1.6, 0.2), (2, 1, 1), (0.8, 0, 0)),
    ],
)
def test_split(case, on_cpu, delay, cgroup_fields, node, expected):
    fields = Fields(on_cpu_nanos=int(on_cpu * S), run_delay_nanos=int(delay * S))
    cpus, seconds, busy = node
    got = split_run_delay(
        fields, cgroup_fields, NodeInterval(cpus, int(seconds * S), int(busy * S))
    )
    assert got == tuple(round(e * S) for e in expected), case


nanos = st.integers(min_value=0, max_value=10**13)


@given(
    on_cpu=nanos,
    delay=nanos,
    throttled=st.none() | nanos,
    usage=st.none() | nanos,
    cpus=st.integers(1, 256),
    interval=st.integers(1, 10**12),
    busy=nanos,
)
def test_the_parts_never_exceed_the_run_delay(
    on_cpu, delay, throttled, usage, cpus, interval, busy
):
    fields = Fields(on_cpu_nanos=on_cpu, run_delay_nanos=delay)
    parts = split_run_delay(
        fields,
        CgroupFields(cgroup_cpu_nanos=usage, cpu_throttled_nanos=throttled),
        NodeInterval(cpus, interval, busy),
    )
    assert all(part >= 0 for part in parts)
    assert sum(parts) <= delay
    assert parts[2] <= max(0, busy - max(on_cpu, usage or 0))  # never more than others used


MS = 1_000_000  # a millisecond in ns


@pytest.mark.parametrize(
    ("case", "periods", "throttled", "quota_ms", "wall"),
    [
        # measured on 6.18 over 5 s (per second here), PSI `full` of each group alone
        # beside: 4 busy threads on 2 CPUs under a 1-CPU quota: throttled time 0.995 s a
        # second over 10 periods, `full` 0.500
        ("4 threads, 2 CPUs, 1-CPU quota", 10, 0.995, 100, 0.499),
        # 2 busy threads under 1.5 CPUs: throttled 0.495, `full` 0.250
        ("2 threads, 1.5-CPU quota", 10, 0.495, 150, 0.248),
        # 1 busy thread under 20%: throttled 0.800, `full` 0.800 (one run queue)
        ("1 thread, 20% quota", 10, 0.8, 20, 0.8),
        # 35% of each second busy under a 50% quota: throttled 0.144 in 3 periods of 6,
        # `full` 0.144
        ("bursts, a third of its periods", 3, 0.144, 50, 0.144),
    ],
)
def test_throttled_wall_time_from_run_queue_time(case, periods, throttled, quota_ms, wall):
    got = throttled_wall_ns(periods, round(throttled * S), quota_ms * MS, 100 * MS)
    assert got == pytest.approx(wall * S, abs=0.003 * S), case


def test_throttled_wall_time_without_the_quota_is_the_throttled_time():
    """Not read (or removed since): as the kernel counts it, never less than the truth
    (what is left of `full` for the neighbours is then never more than theirs)."""
    assert throttled_wall_ns(10, S, None, None) == S
    assert throttled_wall_ns(0, 5 * MS, 100 * MS, 100 * MS) == 5 * MS  # across a pass
    assert throttled_wall_ns(3, 0, 100 * MS, 100 * MS) == 0


@given(
    periods=st.integers(0, 10**6),
    throttled=nanos,
    quota=st.none() | st.integers(1000, 10**12),
    period=st.integers(1000, 10**10),
)
def test_throttled_wall_time_is_within_its_bounds(periods, throttled, quota, period):
    """At least the throttled time over the CPUs its quota spans, never more than the
    throttled time (a throttled moment has a run queue throttled) nor its periods' span."""
    wall = throttled_wall_ns(periods, throttled, quota, period)
    assert 0 <= wall <= throttled
    if quota is not None and periods:
        assert wall <= periods * period
        assert wall >= min(throttled, periods * period) * period // (period + quota) - 1


@pytest.mark.parametrize(
    ("case", "some", "full", "throttled_wall", "expected"),
    [
        # measured on 6.18 (per second of wall): three busy threads pinned to one CPU
        # beside a neighbour busy on the other: some 1.000, full 0.001
        ("pinned behind itself", 1.0, 0.001, 0, (0, 0.001, 0.999)),
        # a one-thread victim sharing its CPU with a two-thread hog: some = full = 0.501
        ("a hog's victim", 0.501, 0.501, 0, (0, 0.501, 0)),
        # one thread at a 20% quota: all of `full` its quota's
        ("at its quota", 0.8, 0.8, 0.8, (0.8, 0, 0)),
        # the quota's wall time over several CPUs, estimated past `full`: capped
        ("estimate past full", 0.9, 0.5, 0.6, (0.5, 0, 0.4)),
        # µs truncation can leave `full` a hair above `some`: no negative own part
        ("full past some", 0.5, 0.500001, 0, (0, 0.500001, 0)),
    ],
)
def test_split_cpu_stall(case, some, full, throttled_wall, expected):
    got = split_cpu_stall(round(some * S), round(full * S), round(throttled_wall * S))
    assert got == tuple(round(e * S) for e in expected), case
    assert sum(got) == max(round(some * S), round(full * S))  # every moment to one cause
    assert min(got) >= 0


def test_with_waits_forms_the_causes_on_one_basis_for_each_group():
    """The one place causes are formed: on the kernel's account for the groups the guard
    gave a throttled wall time (a CPU `full` line), whether or not the node's interval is
    known; on the interval's averages for the others; never both for one group."""
    pod, psi_pod = (Group("cgroup", (("cgroup", f"/{n}"),)) for n in "ab")
    busy = Fields(on_cpu_nanos=S // 5, run_delay_nanos=4 * S // 5)
    from_guard = CgroupFields(
        cgroup_cpu_nanos=S // 5,
        cpu_throttled_nanos=S,
        cpu_pressure_waiting_nanos=S,
        cpu_pressure_stalled_nanos=4 * S // 5,
    )
    kernels = dataclasses.replace(
        from_guard,
        cpu_stalled_throttled_nanos=S // 10,
        cpu_stalled_neighbours_nanos=7 * S // 10,
        cpu_waiting_own_threads_nanos=S // 5,
    )
    for node in (NodeInterval(2, S, 2 * S), None):
        split = with_waits(
            {pod: busy, psi_pod: busy},
            {pod: cgroup(0, 0.2), psi_pod: from_guard},
            {psi_pod: S // 10},
            node,
        )
        assert split[psi_pod] == kernels  # one basis, never both
        assert split[pod].cpu_stalled_neighbours_nanos is None
        if node is not None:
            assert split[pod].run_delay_neighbours_nanos == 4 * S // 5
        else:
            assert split[pod] == cgroup(0, 0.2)  # the node unknown: no interval's split


def test_a_group_that_did_not_wait_has_its_causes_at_zero():
    """Most groups, most passes: the guard's shared delta of an unmoved reading, its causes
    0 (made once, not per pass)."""
    group = Group("cgroup", (("cgroup", "/a"),))
    still = CgroupFields(
        cgroup_cpu_nanos=0, cpu_pressure_waiting_nanos=0, cpu_pressure_stalled_nanos=0
    )
    first = with_waits({}, {group: still}, {group: 0}, None)[group]
    again = with_waits({}, {group: still}, {group: 0}, None)[group]
    assert first is again
    assert (first.cpu_stalled_throttled_nanos, first.cpu_stalled_neighbours_nanos,
            first.cpu_waiting_own_threads_nanos) == (0, 0, 0)  # fmt: skip
    assert dataclasses.replace(first, cpu_stalled_throttled_nanos=None,
                               cpu_stalled_neighbours_nanos=None,
                               cpu_waiting_own_threads_nanos=None) == still  # fmt: skip


def test_node_cpu_is_what_psutil_reads(tmp_path):
    """The busy time of `/proc/stat`'s cpu line: psutil's user + nice + system + irq +
    softirq + steal (its guest time is inside user and nice); its CPU count."""
    hz = 100
    before = psutil.cpu_times()
    node = node_cpu("/proc", hz)
    after = psutil.cpu_times()

    def busy(times) -> float:
        return sum(getattr(times, n) for n in ("user", "nice", "system", "irq", "softirq", "steal"))

    assert node is not None and node.cpus == psutil.cpu_count(logical=True)
    assert busy(before) - 0.011 <= node.busy_ns / S <= busy(after) + 0.011

    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 0 0\nctxt 7\n")
    assert node_cpu(str(tmp_path), hz) == NodeCPU(1, (1 + 2 + 3 + 6 + 7 + 8) * 10_000_000)
    for bad in ("cpu  1 2\ncpu0 1 2 3 4 5 6 7 8\n", "cpu  x 2 3 4 5 6 7 8\ncpu0\n", "intr 1\n"):
        with pytest.raises(Malformed):
            parse_node_cpu(bad.encode(), hz)
        (tmp_path / "stat").write_text(bad)
        assert node_cpu(str(tmp_path), hz) is None
    assert node_cpu(str(tmp_path / "nowhere"), hz) is None


def test_node_interval_is_none_unless_both_readings_are_sound():
    a, b = NodeCPU(2, 10 * S), NodeCPU(2, 11 * S)
    assert node_interval(a, b, S) == NodeInterval(2, S, S)
    assert node_interval(None, b, S) is None  # the first pass
    assert node_interval(a, None, S) is None  # unreadable now
    assert node_interval(a, b, None) is None
    assert node_interval(b, a, S) is None  # fell: never a wrong interval


def test_with_waits_splits_only_groups_with_both_sources():
    pod, cgroup_only, process_only = (Group("cgroup", (("cgroup", f"/{n}"),)) for n in "abc")
    busy = Fields(on_cpu_nanos=S // 5, run_delay_nanos=4 * S // 5)
    intervals = {pod: busy, process_only: busy}
    cgroups = {pod: cgroup(0.8, 0.2), cgroup_only: cgroup(0, 0)}
    node = NodeInterval(2, S, S)
    split = with_waits(intervals, cgroups, {}, node)
    assert set(split) == {pod, cgroup_only}  # no cgroup delta: nothing to split by
    assert split[pod].run_delay_throttled_nanos == 4 * S // 5
    assert split[pod].run_delay_own_threads_nanos == split[pod].run_delay_neighbours_nanos == 0
    assert split[pod].run_delay_runnable_nanos == S  # what the parts are parts of
    assert split[cgroup_only].run_delay_runnable_nanos is None
    assert split[cgroup_only] == cgroups[cgroup_only]  # no process sums: nothing to split
    assert with_waits(intervals, cgroups, {}, None) == cgroups  # the node unknown: no split


def _splits(result) -> dict:
    return {
        group: (
            fields.run_delay_throttled_nanos,
            fields.run_delay_own_threads_nanos,
            fields.run_delay_neighbours_nanos,
        )
        for group, fields in result.cgroup_intervals.items()
        if fields.run_delay_throttled_nanos is not None
    }


def test_a_failed_pass_leaves_the_node_reading_the_next_one_subtracts_from():
    """The node's busy time is taken as a pass's listing is: a pass that fails after its
    reading (in the reader, or in the guard after it) does not move it, so the next pass
    splits over the same interval as it would have without the failure (the same numbers)."""
    from tests.fixturetree import FixtureRun
    from tests.unit.test_engine import Watching
    from tests.unit.test_quiet_cgroups import FailOnce

    clean = FixtureRun()
    clean.engine.run_pass()
    clean.sleep(10)
    expected = _splits(clean.engine.run_pass())
    assert any(any(parts) for parts in expected.values())  # the fixture splits something

    failing = FixtureRun()
    failing.engine.run_pass()
    failing.sleep(10)
    watching = failing.engine.reader = Watching(failing.engine.reader, fail=True)
    with pytest.raises(OSError):
        failing.engine.run_pass()
    watching.fail = False
    failing.engine.tracker = FailOnce(failing.engine.tracker)
    failing.engine.tracker.armed = True
    with pytest.raises(OSError):
        failing.engine.run_pass()
    assert _splits(failing.engine.run_pass()) == expected


# -- what a mutation run of collector/waits.py found untested (docs/development.md) --------


def test_a_stat_without_its_aggregate_line_or_its_cpus_is_malformed():
    """Both the `cpu` line and at least one `cpuN` line, or the file is refused, naming
    itself and its first 80 bytes."""
    per_cpu = b"cpu0 1 0 1 9 0 0 0 0 0 0\ncpu1 1 0 1 9 0 0 0 0 0 0\nintr 5" + b" 0" * 60
    aggregate = b"cpu  2 0 2 18 0 0 0 0 0 0\nintr 5"
    for data in (per_cpu, aggregate):
        with pytest.raises(Malformed) as error:
            parse_node_cpu(data, 100)
        assert error.value.what == "stat" and error.value.text == data[:80]
    with pytest.raises(Malformed) as error:
        parse_node_cpu(b"cpu  2 x 2 18 0 0 0 0 0 0\ncpu0 1 0 1 9 0 0 0 0 0 0\n", 100)
    assert error.value.what == "stat"


def test_the_node_interval_takes_any_positive_length_and_an_idle_node():
    a = NodeCPU(2, 10 * S)
    assert node_interval(a, a, 0) is None  # no time between the two
    assert node_interval(a, a, 1) == NodeInterval(2, 1, 0)  # one ns, and an idle node
    assert node_interval(a, NodeCPU(2, 10 * S + 1), S) == NodeInterval(2, S, 1)


def test_a_group_without_cgroup_cpu_leaves_the_neighbours_the_whole_busy_time():
    """A group that ran nothing and has no cgroup CPU: the rest of the node used all the
    busy time, to the nanosecond."""
    fields = Fields(on_cpu_nanos=0, run_delay_nanos=S)
    throttled, own, neighbours = split_run_delay(
        fields, CgroupFields(cgroup_cpu_nanos=None), NodeInterval(4, S, S // 3)
    )
    assert (throttled, own, neighbours) == (0, 0, S // 3)


def test_throttled_wall_time_is_whole_nanoseconds_from_the_first():
    assert throttled_wall_ns(0, 1, None, None) == 1  # a nanosecond is a nanosecond
    assert throttled_wall_ns(0, 0, None, None) == 0
    wall = throttled_wall_ns(3, 10**9 + 1, 7 * 10**6, 10**8)
    assert isinstance(wall, int) and wall == 3 * 10**8 * (10**9 + 1) // (10**9 + 1 + 21 * 10**6)


def test_without_a_some_line_no_wait_is_its_own_threads():
    assert split_cpu_stall(None, 5, 2) == (2, 3, 0)

"""Guards of the shortcuts that `python -m tests.tools.mutation` found no test for: each test
here fails when its guard is taken out (the mutant named above it), and passes with it.

Most compare the engine that takes every shortcut with the plain reader pass by pass
(tests/unit/test_bound.py's fixture node); a few look at one read of `CgroupFS` alone, and the
last at what the process guard (`Tracker`) counts of its refusals, which mutmut found no
test for."""

from __future__ import annotations

import os
import shutil

import pytest

from collector.cgroupfs import CgroupFS
from collector.tracker import Tracker
from tests.cgroupfixture import pod_cgroups, psi, read_group, v1_stat, v2_stat
from tests.fixturetree import PASS1
from tests.unit.test_bound import (
    CID,
    POD_A,
    POD_B,
    HybridNode,
    K,
    Proc,
    hybrid,
    passes,
    same_intervals,
)  # fmt: skip
from tests.unit.test_incremental import both, comparable, write
from tests.unit.test_tracker import HZ, SEC, proc, thread


def _three_passes_then(root, change):
    full, fast, fs = both(str(root))
    for _ in range(2):
        assert comparable(full.read_pass().processes) == comparable(fast.read_pass().processes)
    change()
    fs.by_pid.clear()
    a, b = full.read_pass(), fast.read_pass()
    assert comparable(a.processes) == comparable(b.processes)
    return fs


# mutant reading/only_waited-forced-false
def test_a_thread_that_only_waited_has_no_status_or_io_read(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PASS1, root)
    on_cpu, delay, slices = (root / "200/task/201/schedstat").read_text().split()

    def wait():
        write(root / "200/task/201/schedstat", f"{on_cpu} {int(delay) + 1000} {slices}\n")

    fs = _three_passes_then(root, wait)
    assert fs.by_pid[200, "task/schedstat"] == 2  # probed, then read
    assert fs.by_pid[200, "task/status"] == 0 and fs.by_pid[200, "task/io"] == 0


# mutant reading/probe-thread-count-dropped
def test_a_quiet_process_one_of_whose_threads_exited(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PASS1, root)
    _three_passes_then(root, lambda: shutil.rmtree(root / "200/task/201"))


# mutants reading/cgroup-carry-confirmed-dropped, reading/cgroup-confirmed-without-equality
@pytest.mark.parametrize(
    "moves",
    [{2: POD_A}, {2: POD_A, 3: POD_B}],
    ids=["between its first two sightings", "at its second and third sightings"],
)
def test_a_process_moved_early_in_its_life(tmp_path, moves):
    """A new process moved into its container's cgroup just after it starts (and once
    more): its cgroup file is read until it reads the same twice running."""
    moved = Proc(9, hybrid(f"{POD_B}/{CID}"))
    node = HybridNode(tmp_path, [moved, Proc(12, hybrid(f"{POD_A}/{CID}"))], [POD_A, POD_B])
    n = [0]

    def each():
        n[0] += 1
        if n[0] in moves:
            moved.cgroup = hybrid(f"{moves[n[0]]}/{CID}")

    for ours, theirs, _, _ in passes(node, 5, each):
        same_intervals(ours, theirs)


class CpuOnlyNode(HybridNode):
    """A hybrid host whose unified tree has no cpu.stat (no cpu controller there) and
    whose v1 `cpu` controller is mounted without `cpuacct`: bandwidth, and no usage."""

    def __init__(self, root, processes, cgroups):
        self.periods = dict.fromkeys(cgroups, 10)
        super().__init__(root, processes, cgroups)

    def write(self):
        super().write()
        (self.cgroup / "cpu,cpuacct" / "cpu.stat").write_text(v1_stat(0, 0, 0))
        for path in self.usage_us:
            os.unlink(self.cgroup / "unified" / path / "cpu.stat")
            os.unlink(self.cgroup / "cpu,cpuacct" / path / "cpuacct.usage")
            p = self.periods[path]
            with open(self.cgroup / "cpu,cpuacct" / path / "cpu.stat", "w") as out:
                out.write(v1_stat(p, p // 2, p * 1000))


# mutant cgroupfs/bandwidth-usage-none-dropped
def test_bandwidth_without_usage_is_read_every_pass(tmp_path):
    node = CpuOnlyNode(tmp_path, [Proc(9, hybrid(f"{POD_A}/{CID}"))], [POD_A])

    def each():
        node.periods[POD_A] += 10

    results = [ours for ours, _, _, _ in passes(node, 3, each)]
    (cgroup,) = results[-1].cgroup_intervals.values()
    assert cgroup.cgroup_cpu_nanos is None
    assert cgroup.cpu_periods == 10


# mutant cgrouppass/quiet-usage-none-dropped
def test_a_group_without_usage_is_never_quiet(tmp_path):
    busy = Proc(9, hybrid(f"{POD_A}/{CID}"))
    node = CpuOnlyNode(tmp_path, [busy], [POD_A])
    for ours, theirs, _, _ in passes(node, 2 + K, busy.run):
        same_intervals(ours, theirs)
        assert ours.carried_by_cgroup == 0


# mutant cgroupfs/bandwidth-previous-none-dropped
def test_bandwidth_unread_last_pass_is_read_though_usage_stood_still(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    pod = tmp_path / "kubepods" / "podaaaaaaaa-0000-4000-8000-00000000000a"
    pod.mkdir(parents=True)
    (pod / "cpu.stat").write_text("usage_usec 100\nnr_periods 10\nnr_throttled 2\n")  # cut
    fs = CgroupFS(str(tmp_path), whole_read_passes=None)
    ((_, locations),) = pod_cgroups(fs, False).items()
    first = read_group(fs, locations)
    assert first.bandwidth is None
    fs.release_unused()
    with open(pod / "cpu.stat", "w") as out:
        out.write(v2_stat(100, 10, 2, 500))
    assert read_group(fs, locations, first).bandwidth is not None


# mutant cgroupfs/stalled-without-parent-reading (a previous reading older than the last pass)
def test_psi_of_a_reading_two_passes_old_is_not_carried(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "cpu.pressure").write_text(psi(0))
    parent = tmp_path / "kubepods"
    pod = parent / "podaaaaaaaa-0000-4000-8000-00000000000a"
    pod.mkdir(parents=True)
    for d in (parent, pod):
        for name in ("cpu.pressure", "memory.pressure", "io.pressure"):
            (d / name).write_text(psi(5))
    (pod / "cpu.stat").write_text(v2_stat(100))
    fs = CgroupFS(str(tmp_path), whole_read_passes=None)
    ((_, locations),) = pod_cgroups(fs, False).items()
    first = read_group(fs, locations)
    fs.release_unused()
    fs.release_unused()  # a pass that did not read it
    for d in (parent, pod):
        with open(d / "cpu.pressure", "w") as out:
            out.write(psi(9))
    assert read_group(fs, locations, first).pressure[0].some_us == 9


# mutant cgrouppass/holds-unplaced-true
def test_a_pod_process_whose_path_cannot_be_placed_is_never_carried(tmp_path):
    text = f"4:cpu,cpuacct:/../../{POD_A}/{CID}\n0::/../../{POD_A}/{CID}\n"
    outside = Proc(9, text)
    node = HybridNode(tmp_path, [outside, Proc(10, hybrid(f"{POD_A}/{CID}"))], [POD_A])
    for ours, theirs, _, _ in passes(node, 2 + K, outside.run):
        same_intervals(ours, theirs)
    assert ours.carried_by_cgroup >= 1


class CpuacctUsageNode(HybridNode):
    """A hybrid host whose unified tree has no cpu.stat: usage from v1 cpuacct."""

    def write(self):
        super().write()
        (self.cgroup / "cpu,cpuacct" / "cpu.stat").write_text(v1_stat(0, 0, 0))
        (self.cgroup / "cpu,cpuacct" / "cpuacct.usage").write_text("0\n")
        for path in self.usage_us:
            os.unlink(self.cgroup / "unified" / path / "cpu.stat")


# mutant cgrouppass/holds-prefix-without-slash
def test_a_sibling_whose_name_extends_the_quiet_pods_is_not_held(tmp_path):
    idle = Proc(8, hybrid(f"{POD_A}/{CID}"))
    beside = Proc(16, f"4:cpu,cpuacct:/{POD_A}-b/{CID}\n0::/{POD_A}/{CID}\n")
    node = CpuacctUsageNode(tmp_path, [idle, beside], [POD_A, f"{POD_A}-b"])
    for ours, theirs, _, _ in passes(node, 2 + K, beside.run):
        same_intervals(ours, theirs)
    assert ours.carried_by_cgroup >= 1


# mutmut: each refusal count of `Tracker.advance` and `_guard_threads`, `+= 1` → `= 1`
def test_two_processes_or_threads_refused_for_one_reason_in_one_pass_count_two():
    """`procdelta_dropped_deltas_total{reason}` and `…_dropped_thread_deltas_total{reason}`
    count processes and threads: two refused for the same reason in one pass count two,
    whether two processes (first seen, a counter fell) or two threads of one process (a
    counter fell, first seen though not born since the previous pass)."""
    tracker = Tracker(HZ)
    first = tracker.advance(
        [proc(10, 5_000, 100 * SEC, user=5, threads=[thread(10, 5_000, cpu=50),
                                                      thread(11, 5_000, cpu=50)]),
         proc(20, 5_000, 100 * SEC, user=5),
         proc(30, 5_000, 100 * SEC, user=5)],
        100 * SEC,
    )  # fmt: skip
    assert dict(first.refused) == {"first_seen": 3}
    # 30 shows two threads never seen that started before the previous pass
    second = tracker.advance(
        [proc(10, 5_000, 200 * SEC, user=6, threads=[thread(10, 5_000, cpu=60),
                                                      thread(11, 5_000, cpu=60)]),
         proc(20, 5_000, 200 * SEC, user=6),
         proc(30, 5_000, 200 * SEC, user=6, threads=[thread(30, 5_000), thread(31, 5_000),
                                                      thread(32, 5_000)])],
        200 * SEC,
    )  # fmt: skip
    assert dict(second.refused) == {}
    assert dict(second.threads_refused) == {"first_seen": 2}
    # both threads of 10 fell (10 itself did not: it contributes); 20's and 30's stat fell
    third = tracker.advance(
        [proc(10, 5_000, 300 * SEC, user=7, threads=[thread(10, 5_000, cpu=1),
                                                      thread(11, 5_000, cpu=1)]),
         proc(20, 5_000, 300 * SEC, user=1),
         proc(30, 5_000, 300 * SEC, user=1)],
        300 * SEC,
    )  # fmt: skip
    assert dict(third.refused) == {"counter_fell": 2}
    assert dict(third.threads_refused) == {"counter_fell": 2}
    assert [delta.reading.pid for delta in third.deltas] == [10]

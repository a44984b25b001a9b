"""Read less, lose nothing: each case where a shortcut's fact does not hold, and each guard
of the shortcuts, on a fixture node changed in place pass after pass.

An engine that takes every shortcut is compared with one whose reader reads every file
(the plain reader, collector/plainread.py). Where a shortcut is sound the two agree pass
by pass; where it cannot know (a process moved out of a quiet cgroup by another), the
bound applies: the process is read whole within K passes (`WHOLE_READ_PASSES`) and every
count it had is in the totals then, late, never lost.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS
from collector.engine import Engine, PassResult
from collector.groups import Grouper
from collector.model import WHOLE_READ_PASSES
from collector.plainread import PlainReader
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker
from collector.wiring import Options, build_engine
from tests.cgroupfixture import v1_stat, v2_stat
from tests.fixturetree import ScriptedClock

K = WHOLE_READ_PASSES
POD_A = "kubepods/burstable/podaaaaaaaa-0000-4000-8000-00000000000a"
POD_B = "kubepods/burstable/podbbbbbbbb-0000-4000-8000-00000000000b"
CID = "1c" * 32
MS = 10**6


@dataclass
class Proc:
    """A single-threaded process and the counters its files say now."""

    pid: int
    cgroup: str  # the text of its `cgroup` file
    on_cpu_ns: int = 10**9
    timeslices: int = 10
    voluntary: int = 5
    read_bytes: int = 0
    utime_ticks: int = 7
    schedstat: str | None = None  # as written, when not from the counters

    def run(self, ms: int = 10) -> None:
        """It ran: on a CPU for `ms`, picked once more, switched, read, used user time."""
        self.on_cpu_ns += ms * MS
        self.timeslices += 1
        self.voluntary += 1
        self.read_bytes += 4096
        self.utime_ticks += 1


def hybrid(path: str) -> str:
    """A hybrid host's cgroup file: the v1 cpu,cpuacct path and the v2 one the same."""
    return f"4:cpu,cpuacct:/{path}\n0::/{path}\n"


class HybridNode:
    """A hybrid host (v1 cpu,cpuacct beside a v2 tree) whose files are rewritten in place,
    as the kernel's are: `/proc` and `/sys/fs/cgroup` as plain files."""

    def __init__(self, root: Path, processes: list[Proc], cgroups: list[str]):
        self.proc, self.cgroup = root / "proc", root / "cgroup"
        self.processes = {p.pid: p for p in processes}
        self.usage_us = dict.fromkeys(cgroups, 1000)  # each cgroup's, in both hierarchies
        (self.cgroup / "unified").mkdir(parents=True)
        (self.cgroup / "unified" / "cgroup.controllers").write_text("cpu memory io\n")
        (self.cgroup / "cpu,cpuacct").mkdir()
        self.write()

    def charge(self, cgroup: str, ms: int = 10) -> None:
        """The kernel charges a cgroup's usage while a task of it runs."""
        self.usage_us[cgroup] += ms * 1000

    def write(self) -> None:
        for name in os.listdir(self.proc) if self.proc.exists() else ():
            if int(name) not in self.processes:
                for base, dirs, files in os.walk(self.proc / name, topdown=False):
                    for file in files:
                        os.remove(os.path.join(base, file))
                    for directory in dirs:
                        os.rmdir(os.path.join(base, directory))
                os.rmdir(self.proc / name)
        for p in self.processes.values():
            task = self.proc / str(p.pid) / "task" / str(p.pid)
            task.mkdir(parents=True, exist_ok=True)
            stat = (
                f"{p.pid} (p{p.pid}) S 1 {p.pid} {p.pid} 0 -1 4194560 0 0 0 0 {p.utime_ticks} "
                "0 0 0 20 0 1 0 100 10000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 "
                "0 17 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
            )
            io = f"rchar: 0\nwchar: 0\nsyscr: 0\nsyscw: 0\nread_bytes: {p.read_bytes}\n"
            io += "write_bytes: 0\ncancelled_write_bytes: 0\n"
            files = {
                self.proc / str(p.pid) / "stat": stat,
                self.proc / str(p.pid) / "cgroup": p.cgroup,
                self.proc / str(p.pid) / "io": io,
                task / "stat": stat,
                task / "schedstat": p.schedstat or f"{p.on_cpu_ns} 0 {p.timeslices}\n",
                task / "status": f"Name:\tp{p.pid}\nvoluntary_ctxt_switches:\t{p.voluntary}\n"
                "nonvoluntary_ctxt_switches:\t0\n",
                task / "io": io,
            }
            for path, text in files.items():
                with open(path, "w") as out:  # in place, as the kernel's files are
                    out.write(text)
        for path, usage in self.usage_us.items():
            for tree, files in (
                ("unified", {"cpu.stat": v2_stat(usage)}),
                (
                    "cpu,cpuacct",
                    {"cpu.stat": v1_stat(0, 0, 0), "cpuacct.usage": f"{usage * 1000}\n"},
                ),
            ):
                directory = self.cgroup / tree / path
                directory.mkdir(parents=True, exist_ok=True)
                for name, text in files.items():
                    with open(directory / name, "w") as out:
                        out.write(text)

    def engine(self, fast: bool, every: int | None = K) -> Engine:
        procfs = ProcFS(str(self.proc))
        if fast:
            reader = Reader(procfs, ScriptedClock(), page_size=4096, whole_read_passes=every)
        else:
            reader = PlainReader(procfs, clock=ScriptedClock(), page_size=4096)
        return Engine(
            reader,
            Tracker(hz=100),
            Grouper(PodNames("/nonexistent", "/nonexistent")),
            Totals(),
            wall_clock=lambda: 1_700_000_000.0,
            timer=lambda: 0.0,
            cgroupfs=CgroupFS(str(self.cgroup), whole_read_passes=every),
            carry_quiet=fast,
        )


def on_cpu_totals(engine: Engine) -> dict[tuple, int]:
    """Each group's on-CPU time accumulated so far."""
    return {
        group.labels: totals["on_cpu_nanos"]
        for group, totals in engine.totals.snapshot().items()
        if "on_cpu_nanos" in totals
    }


def same_intervals(ours: PassResult, theirs: PassResult) -> None:
    """The same groups with the same fields, observed time within the scripted clocks'
    microseconds."""
    assert ours.intervals.keys() == theirs.intervals.keys()
    for group, fields in ours.intervals.items():
        assert abs(fields.observed_nanos - theirs.intervals[group].observed_nanos) < MS
        assert dataclasses.replace(fields, observed_nanos=0) == dataclasses.replace(
            theirs.intervals[group], observed_nanos=0
        ), group


def passes(
    node: HybridNode, count: int, each: Callable[[], None] = lambda: None, every: int | None = K
):
    """`count` passes of a fast and a plain engine (its bound `every`) over the node, `each`
    run before each pass; yields their results."""
    fast, plain = node.engine(True, every), node.engine(False)
    for _ in range(count):
        each()
        node.write()
        yield fast.run_pass(), plain.run_pass(), fast, plain


# -- a process moved out of a quiet cgroup: counted within K passes --------------------


def moved_process_behind(tmp_path: Path, every: int | None) -> list[bool]:
    """Another process moves PID 9 from idle pod A into pod B at pass 5, where it runs every
    pass from then on; whether the fast engine's totals are behind the plain one's, each
    pass from the move."""
    moved = Proc(9, hybrid(f"{POD_A}/{CID}"))
    node = HybridNode(tmp_path, [moved, Proc(12, hybrid(f"{POD_B}/{CID}"))], [POD_A, POD_B])
    step = {"n": 0}

    def each() -> None:
        step["n"] += 1
        node.processes[12].run()
        node.charge(POD_B)
        if step["n"] >= 5:
            moved.cgroup = hybrid(f"{POD_B}/{CID}")
            moved.run()
            node.charge(POD_B)

    results = passes(node, 5 + K, each, every)
    return [on_cpu_totals(fast) != on_cpu_totals(plain) for _, _, fast, plain in results][4:]


def test_without_the_bound_a_moved_process_is_never_counted(tmp_path):
    """The case above with no whole reads (`whole_read_passes=None`, which only the bench
    runs, to weigh the bound): the process stays carried as the idle pod's, and its time in
    pod B is missing pass after pass. The whole read is what catches it up."""
    assert all(moved_process_behind(tmp_path, None))


def test_the_engine_runs_with_the_bound(tmp_path):
    """`build_engine` hands K to the reader and the cgroups alike, and by default the
    module's `WHOLE_READ_PASSES`."""
    options = Options(pod_logs=str(tmp_path), container_logs=str(tmp_path))
    engine = build_engine(options)
    assert engine.reader.whole_read_passes == engine.cgroupfs.whole_read_passes == K
    engine = build_engine(dataclasses.replace(options, whole_read_passes=7))
    assert engine.reader.whole_read_passes == engine.cgroupfs.whole_read_passes == 7


def test_a_process_moved_out_of_a_quiet_cgroup_is_counted_within_k_passes(tmp_path):
    """Another process moves PID 9 from idle pod A into pod B, where it runs every pass.
    Pod A's usage stands still, so 9 is carried unread as A's (its `cgroup` file is one of
    the files it does not read) until it is read whole — at most K passes — and then every
    ms it ran since is counted, in pod B: late, not lost. The plain reader counts it each
    pass; the two totals are equal from that pass on."""
    assert (9 + 5) % K, "9 is not read whole at the move (pass 5)"
    behind = moved_process_behind(tmp_path, K)
    caught_up = behind.index(False)
    assert 1 <= caught_up <= K, behind  # it was carried (the shortcut), then read whole
    assert not any(behind[caught_up:]), behind  # and equal every pass since


def test_run_delay_grown_without_usage_is_counted_within_k_passes(tmp_path):
    """A queued task that never ran is dequeued (moved to another CPU's queue, say): the
    kernel adds its wait to its run delay, and neither its on-CPU time nor its cgroup's
    usage moves. Its cgroup is quiet, so the wait is read at its next whole read: late by
    at most K passes, then in the totals."""
    waiting = Proc(K - 7, hybrid(f"{POD_A}/{CID}"))  # read whole at pass 7
    node = HybridNode(tmp_path, [waiting], [POD_A])

    def each() -> None:
        waiting.schedstat = f"{waiting.on_cpu_ns} {5 * MS * each.n} {waiting.timeslices}\n"
        each.n += 1

    each.n = 0
    delays = []
    for _, _, fast, plain in passes(node, 2 + K, each):
        delays.append([e.totals.snapshot() for e in (fast, plain)])
    fast_delay, plain_delay = (
        [sum(t.get("run_delay_nanos", 0) for t in pair[i].values()) for pair in delays]
        for i in (0, 1)
    )
    assert not (waiting.pid + 7) % K
    assert fast_delay[6] == plain_delay[6] == 5 * MS * 6  # caught up then
    assert fast_delay[5] < plain_delay[5] and fast_delay[-1] < plain_delay[-1]  # carried
    # the bound: no wait is missing for longer than K passes
    assert all(fast_delay[n] >= plain_delay[n - K] for n in range(K, len(delays)))


# -- the cgroup whose usage stood still must hold the process ---------------------------


def test_a_pod_process_outside_its_pods_v2_cgroup_is_never_carried(tmp_path):
    """A process whose `cgroup` file names its pod on v1 only, at the v2 root (as podman's
    `conmon` sits on this kind of host): the pod's v2 usage — what proves a pod quiet —
    does not count it. It runs every pass while its pod's v2 usage stands still: it is
    read every pass, and both engines agree pass by pass."""
    outside = Proc(9, f"4:cpu,cpuacct:/{POD_A}/conmon\n0::/\n")
    node = HybridNode(tmp_path, [outside, Proc(10, hybrid(f"{POD_A}/{CID}"))], [POD_A])
    for _ours, _theirs, _, _ in passes(node, 2 + K, outside.run):
        same_intervals(_ours, _theirs)
    (pod,) = [g for g in _ours.intervals if g.kind == "pod"]
    assert _ours.intervals[pod].on_cpu_nanos == 10 * MS
    assert _ours.carried_by_cgroup >= 1  # the other process of the pod is carried


def test_two_processes_labelled_alike_by_different_hierarchies(tmp_path):
    """Two processes outside any pod both labelled `/svc`: one by its v2 path (its v1 cpu
    path the root), the other by its v1 cpu path (its v2 path the root). The group's cgroup
    is read where the first sits (v2 `/svc`), which does not count the second: the second
    runs every pass and is read every pass."""
    first = Proc(8, "4:cpu,cpuacct:/\n0::/svc\n")
    second = Proc(16, "4:cpu,cpuacct:/svc\n0::/\n")
    node = HybridNode(tmp_path, [first, second], ["svc"])
    for ours, theirs, _, _ in passes(node, 2 + K, second.run):
        same_intervals(ours, theirs)
    assert [f.on_cpu_nanos for f in ours.intervals.values()] == [10 * MS]


# -- a kernel that keeps no sched_info -----------------------------------------------------


def test_a_schedstat_of_zeros_proves_nothing(tmp_path):
    """Without sched_info every thread's `schedstat` reads `0 0 0`, however much it runs:
    its switches, its bytes and its process's user time must still be read every pass."""
    busy = Proc(9, hybrid(f"{POD_A}/{CID}"), schedstat="0 0 0\n")
    node = HybridNode(tmp_path, [busy], [POD_A])

    def each() -> None:
        busy.run()
        node.charge(POD_A)

    for ours, theirs, _, _ in passes(node, 2 + K, each):
        same_intervals(ours, theirs)
    (fields,) = ours.intervals.values()
    assert (fields.voluntary_switches, fields.read_bytes) == (1, 4096)
    assert fields.cpu_user_nanos == 10 * MS  # one tick


# -- the guards of the thread shortcuts ---------------------------------------------------


def test_a_thread_picked_and_not_yet_charged_has_its_switches_read(tmp_path):
    """`only_waited` needs both halves: a thread picked since the last pass and still on
    its CPU shows the same on-CPU time (charged at the next tick or switch) with its run
    count moved; it may have switched meanwhile, so its `status` is read."""
    picked = Proc(9, hybrid(f"{POD_A}/{CID}"))

    def each() -> None:
        picked.timeslices += 1  # picked, not charged: on-CPU time as it was
        picked.voluntary += 1
        node.charge(POD_A)

    node = HybridNode(tmp_path, [picked], [POD_A])
    for ours, theirs, _, _ in passes(node, 2 + K, each):
        same_intervals(ours, theirs)
    assert [f.voluntary_switches for f in ours.intervals.values()] == [1]


LATE = K - 7
"""A PID read whole at pass 7."""


class LateRun(ProcFS):
    """A ProcFS over which PID `LATE` runs once right after its `stat` is read (one pass)."""

    def __init__(self, root: str, node: HybridNode):
        super().__init__(root)
        self.node, self.armed = node, False

    def process_file(self, pid: int, name: str) -> bytes:
        data = super().process_file(pid, name)
        if self.armed and pid == LATE and name == "stat":
            self.armed = False
            self.node.processes[LATE].run()
            self.node.charge(POD_A)
            self.node.write()
        return data


def test_a_process_that_ran_during_its_read_is_not_probed_the_pass_after(tmp_path):
    """PID `LATE` runs between the read of its `stat` and of its thread's `schedstat`, in
    the pass that reads it whole (pass 7): that reading has the new schedstat and the old user
    time. The next pass nothing moves: its thread is unchanged since that read, but its
    `stat` is behind it, so the probe that would carry it must not be tried (a read with
    no probe counts every thread as having run, `not previous.ran`); its `stat` is read
    and the tick counted at once, not at its next whole read."""
    assert not (LATE + 7) % K
    node = HybridNode(tmp_path, [Proc(LATE, hybrid(f"{POD_A}/{CID}")), Proc(10, hybrid(POD_B))],
                      [POD_A, POD_B])  # fmt: skip
    late = LateRun(str(node.proc), node)
    fast = Engine(
        Reader(late, clock=ScriptedClock(), page_size=4096),
        Tracker(hz=100),
        Grouper(PodNames("/nonexistent", "/nonexistent")),
        Totals(),
        cgroupfs=None,  # no quiet cgroups: the probe alone
    )
    user = []
    for n in range(1, 10):
        late.armed = n == 7
        fast.run_pass()
        user.append(sum(t.get("cpu_user_nanos", 0) for t in fast.totals.snapshot().values()))
    # the tick of its run during pass 7 is counted at pass 8, the pass right after
    assert user == [0] * 7 + [10 * MS] * 2


def test_a_group_read_after_its_processes_proves_nothing(tmp_path):
    """The engine's own check, apart from the reader's: a group whose cgroup the last pass
    read after its processes (a non-pod group seen for the first time) is not quiet this
    pass, though its usage did not move since that read: the process may have run
    between its read and the group's."""
    node = HybridNode(tmp_path, [Proc(9, hybrid("svc"))], ["svc"])
    engine = node.engine(True)
    asked: list[Callable[[bytes], bool] | None] = []
    real = engine.reader.read_pass

    def read_pass(quiet=None):
        asked.append(quiet)
        return real(quiet)

    engine.reader.read_pass = read_pass
    engine.run_pass()  # `svc` first seen: read after its process
    engine.run_pass()  # read before its process, for the first time: proves nothing yet
    engine.run_pass()  # read before it twice, usage still: quiet
    text = node.processes[9].cgroup.encode()
    assert asked[0] is None and asked[1] is None
    assert asked[2] is not None and asked[2](text)

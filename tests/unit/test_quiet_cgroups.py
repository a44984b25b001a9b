"""A group whose cgroup did not run has its processes carried over unread.

Over a fixture node changed in place pass after pass (a pure v2 host: an idle pod, a pod
that runs, a service), an engine that takes the shortcut is compared with one whose
reader reads every file every pass: the readings are identical, and the reads counted
per PID show which processes were not read at all. The live kernel counterpart is in
tests/unit/test_incremental.py.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS
from collector.engine import Engine, PassResult
from collector.groups import Grouper
from collector.passloop import PassLoop
from collector.plainread import PlainReader
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import WHOLE_READ_PASSES, Reader
from collector.tracker import Tracker
from tests.cgroupfixture import Process, pressure, v2_stat, write_proc
from tests.fixturetree import ScriptedClock, every_process
from tests.unit.test_incremental import CountingProcFS, comparable

A = "kubepods/burstable/podaaaaaaaa-0000-4000-8000-00000000000a"  # idle
B = "kubepods/burstable/podbbbbbbbb-0000-4000-8000-00000000000b"  # runs every pass
S = "system.slice/s.service"  # idle
CID = "1c" * 32
# PIDs ≡ 0 mod 8: none is due for its periodic refresh in passes 3 to 7
IDLE_A, IDLE_A2, RUNS_B, IDLE_S, NEW_A = 8, 16, 24, 32, 40
SECOND = 9  # IDLE_A's second thread


class Capturing:
    """The engine's reader, keeping what each pass read."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self.last = None
        self.after: Callable[[], None] | None = None  # runs once, right after a read

    def read_pass(self, quiet: Callable[[bytes], bool] | None = None):
        self.last = self.reader.read_pass(quiet)
        if self.after is not None:
            self.after, after = None, self.after
            after()
        return self.last


def process(pid: int, cgroup: str, cpu: int = 10**9) -> Process:
    return Process(pid, f"p{pid}", f"0::/{cgroup}\n", (cpu, cpu), (0, 0))


class Node:
    def __init__(self, root: Path):
        self.proc, self.cgroup = root / "proc", root / "cgroup"
        self.usage = {A: 10**6, B: 10**6, S: 10**6}
        self.processes = [
            process(IDLE_A, f"{A}/{CID}"),
            process(IDLE_A2, f"{A}/{CID}"),
            process(RUNS_B, f"{B}/{CID}"),
            process(IDLE_S, S),
        ]
        (self.cgroup).mkdir()
        (self.cgroup / "cgroup.controllers").write_text("cpu io memory\n")
        (self.cgroup / "cpu.pressure").write_text(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        )
        self.write()

    def write(self) -> None:
        write_proc(self.proc, tuple(self.processes), 0, in_place=True)
        # IDLE_A has a second thread, idle as the first: a block's footprint counts threads
        idle = self.proc / str(IDLE_A)
        if idle.exists():
            task = idle / "task"
            shutil.copytree(task / str(IDLE_A), task / str(SECOND), dirs_exist_ok=True)
            stat = (idle / "stat").read_text().replace(" 20 0 1 0 ", " 20 0 2 0 ", 1)
            for path in (idle / "stat", task / str(IDLE_A) / "stat"):
                path.write_text(stat)
            (task / str(SECOND) / "stat").write_text(f"{SECOND}{stat[len(str(IDLE_A)) :]}")
            shutil.copy(task / str(IDLE_A) / "io", idle / "io")  # the process's own sums
        for path, usage in self.usage.items():
            directory = self.cgroup / path
            (directory / CID).mkdir(parents=True, exist_ok=True)
            for name, text in {"cpu.stat": v2_stat(usage), **pressure("", (0, 0))}.items():
                with open(directory / name.lstrip("/"), "w") as out:  # in place
                    out.write(text)

    def engine(self, fast: bool, clock: ScriptedClock) -> tuple[Engine, CountingProcFS | None]:
        procfs = CountingProcFS(str(self.proc)) if fast else ProcFS(str(self.proc))
        engine = Engine(
            Capturing(
                Reader(procfs, clock=clock, page_size=4096)
                if fast
                else PlainReader(procfs, clock=clock, page_size=4096)
            ),
            Tracker(hz=100),
            Grouper(PodNames("/nonexistent", "/nonexistent")),
            Totals(),
            wall_clock=lambda: 1_700_000_000.0,
            timer=lambda: 0.0,
            cgroupfs=CgroupFS(str(self.cgroup)),
            carry_quiet=fast,
        )
        return engine, procfs if fast else None


def run_b(node: Node, step: int) -> None:
    """B's process ran: its counters and its cgroup's usage moved."""
    node.usage[B] += 1000 * step
    node.processes[2] = process(RUNS_B, f"{B}/{CID}", cpu=10**9 + step * 10**6)


def same_sums(ours: PassResult, theirs: PassResult) -> bool:
    """The same groups, processes, footprints and fields, observed time within 1 ms."""
    assert ours.intervals.keys() == theirs.intervals.keys()
    assert ours.footprints == theirs.footprints
    for group, fields in ours.intervals.items():
        other = theirs.intervals[group]
        assert abs(fields.observed_nanos - other.observed_nanos) < 10**6, group
        assert dataclasses.replace(fields, observed_nanos=0) == dataclasses.replace(
            other, observed_nanos=0
        ), group
    return True


def pass_of_both(fast: Engine, full: Engine, counting: CountingProcFS) -> set[int]:
    """A pass of the fast engine and of the plain one: their readings are the same. The
    PIDs the fast one read a file of."""
    counting.by_pid.clear()
    fast.run_pass()
    full.run_pass()
    fast_read, full_read = every_process(fast.reader.last), every_process(full.reader.last)
    assert comparable(fast_read) == comparable(full_read)
    return {pid for (pid, _), n in counting.by_pid.items() if n}


def test_idle_groups_are_carried_unread_and_identical_to_a_full_read(tmp_path):
    node = Node(tmp_path)
    (fast, counting), (full, _) = (
        node.engine(True, ScriptedClock()),
        node.engine(False, ScriptedClock()),
    )
    results: list[PassResult] = []

    def both() -> dict[int, int]:
        """One pass of both engines; reads of each PID by the fast one."""
        counting.by_pid.clear()
        results.append(fast.run_pass())
        plain = full.run_pass()
        ours, theirs = fast.reader.last, full.reader.last
        assert comparable(every_process(ours)) == comparable(every_process(theirs))
        # the sums too: carried processes go through the guard and the sums as a block;
        # observed time differs by the scripted clock's microsecond per reading only
        assert same_sums(results[-1], plain)
        reads: dict[int, int] = {}
        for (pid, _), count in counting.by_pid.items():
            reads[pid] = reads.get(pid, 0) + count
        return reads

    def carried(reads: dict[int, int]) -> set[int]:
        return {pid for pid in (IDLE_A, IDLE_A2, RUNS_B, IDLE_S, NEW_A) if not reads.get(pid)}

    both()  # first sighting: every file read
    run_b(node, 1)
    node.write()
    both()  # the cgroup files read again and found the same: from now, confirmed
    assert results[-1].carried_by_cgroup == 0

    run_b(node, 2)
    node.write()
    reads = both()
    assert carried(reads) == {IDLE_A, IDLE_A2, IDLE_S, NEW_A}  # NEW_A does not exist yet
    assert results[-1].carried_by_cgroup == 3

    # a process moved into the idle pod (its usage does not move): read, the others not
    node.processes.append(process(NEW_A, f"{A}/{CID}"))
    node.write()
    reads = both()
    assert reads.get(NEW_A) and carried(reads) >= {IDLE_A, IDLE_A2, IDLE_S}

    # the idle pod's cgroup made anew under the same path, with the same usage: no shortcut
    os.rename(node.cgroup / A, tmp_path / "old-a")
    node.write()
    reads = both()
    assert reads.get(IDLE_A) and reads.get(IDLE_A2) and IDLE_S in carried(reads)
    assert results[-1].dropped_cgroups["recreated"] == 1

    node.write()
    assert {IDLE_A, IDLE_A2, NEW_A} <= carried(both())  # quiet again

    # its usage fell: no shortcut, and the cgroup delta is dropped and counted
    node.usage[A] -= 10
    node.write()
    reads = both()
    assert reads.get(IDLE_A) and reads.get(NEW_A)
    assert results[-1].dropped_cgroups["counter_fell"] == 1

    # the totals of the two engines agree, field by field (the shortcut defers nothing
    # here: the fixture's counters only move with their cgroup's usage)
    assert {
        g: {k: v for k, v in t.items() if k != "observed_nanos"}
        for g, t in results[-1].totals.items()
    } == {
        g: {k: v for k, v in t.items() if k != "observed_nanos"}
        for g, t in full.totals.snapshot().items()
    }


def test_without_cgroup_usage_nothing_is_carried(tmp_path):
    node = Node(tmp_path)
    for path in (A, B, S):
        os.unlink(node.cgroup / path / "cpu.stat")
    fast, counting = node.engine(True, ScriptedClock())
    for _ in range(4):
        counting.by_pid.clear()
        result = fast.run_pass()
        assert result.carried_by_cgroup == 0
    assert counting.by_pid[IDLE_A, "stat"] == 0  # quiet by its schedstat alone: stat not read
    assert counting.by_pid[IDLE_A, "task/schedstat"] == 2  # but its two threads were read


def test_an_interval_with_the_shortcut_sums_the_same(tmp_path):
    node = Node(tmp_path)
    fast, _ = node.engine(True, ScriptedClock())
    full, _ = node.engine(False, ScriptedClock())
    loop = PassLoop(fast, interval=1.0, monotonic=lambda: 0.0)
    for step in range(1, 6):
        run_b(node, step)
        node.write()
        a, b = loop.run_pass(), full.run_pass()
        strip = lambda fields: {k: v for k, v in fields.as_dict().items() if k != "observed_nanos"}  # noqa: E731
        assert {g: strip(f) for g, f in a.intervals.items()} == {
            g: strip(f) for g, f in b.intervals.items()
        }
        assert a.cgroup_intervals == b.cgroup_intervals
    assert a.carried_by_cgroup == 3
    assert b"\nprocdelta_skipped_processes 3\n" in loop.snapshot().text


def test_a_group_first_read_after_its_processes_proves_nothing_until_read_before_them(tmp_path):
    """A service seen for the first time has its cgroup read at the end of the pass,
    after its process was read: a run in between is in that usage but not in the
    process's reading. The next pass must read the process, even though the usage then
    equals that late reading."""
    node = Node(tmp_path)
    fast, _ = node.engine(True, ScriptedClock())
    full, _ = node.engine(False, ScriptedClock())
    late = "system.slice/late.service"
    for _ in range(2):
        fast.run_pass()
        full.run_pass()
    node.usage[late] = 10**6
    node.processes.append(process(48, late))  # PID 48: no refresh due in the passes below
    node.write()

    def runs_after_its_read():  # the process runs once its files were read, this pass
        node.processes[-1] = process(48, late, cpu=2 * 10**9)
        node.usage[late] += 10**6
        node.write()

    fast.reader.after = runs_after_its_read
    fast.run_pass()  # first sighting of the service: its cgroup read late
    full.run_pass()
    for _ in range(3):  # nothing runs any more
        fast.run_pass()
        full.run_pass()
        assert comparable(every_process(fast.reader.last)) == comparable(
            every_process(full.reader.last)
        )
    totals = {g.labels: t for g, t in fast.totals.snapshot().items()}
    assert totals[(("cgroup", "/" + late),)]["on_cpu_nanos"] == 10**9  # the run, counted


def test_a_carried_process_is_read_whole_every_k_passes(tmp_path):
    """A process due to be read whole at pass 4 ((pid + 4) % K == 0), though its cgroup is
    quiet: reclaim shrank its memory meanwhile. Every file of it is read, as the plain
    reader reads it, and its reading is the plain reader's."""
    pid = WHOLE_READ_PASSES - 4
    node = Node(tmp_path)
    node.processes.append(process(pid, f"{A}/{CID}"))
    node.write()
    (fast, counting), (full, _) = (
        node.engine(True, ScriptedClock()),
        node.engine(False, ScriptedClock()),
    )
    for _ in range(3):
        fast.run_pass()
        full.run_pass()
    node.processes[-1] = dataclasses.replace(node.processes[-1], rss_pages=40)
    node.write()
    counting.by_pid.clear()
    fast.run_pass()
    full.run_pass()
    assert {name for (p, name), n in counting.by_pid.items() if p == pid and n} == {
        "stat",
        "cgroup",
        "task/schedstat",
        "task/status",
        "task/io",
    }
    fast_read, full_read = every_process(fast.reader.last), every_process(full.reader.last)
    assert comparable(fast_read) == comparable(full_read)
    (whole,) = [r for r in fast_read if r.pid == pid]
    assert whole.rss_bytes == 40 * 4096
    # the other four (B does not run in this test) were carried
    assert fast.reader.last.carried_by_cgroup == 4


def test_a_block_whose_process_exited_or_whose_pid_names_a_new_one_is_looked_at_again(
    tmp_path,
):
    """A quiet pod's processes are carried as one block from pass to pass, without a look
    at each. One of them exits and its PID names a new process in the same pod (a new
    `<pid>` directory), the pod's usage scripted still; then one exits for good. Each
    time the block is looked at process by process: the new process is read, the gone
    one is not carried, and the readings are the plain reader's."""
    node = Node(tmp_path)
    (fast, counting), (full, _) = (
        node.engine(True, ScriptedClock()),
        node.engine(False, ScriptedClock()),
    )

    def both() -> set[int]:
        return pass_of_both(fast, full, counting)

    for _ in range(4):  # A's two processes carried, as a block from the fourth pass
        read = both()
    assert not read & {IDLE_A, IDLE_A2}
    blocks = fast.reader.last.carried
    both()  # the blocks stand: carried again as they are, without a look at each process
    assert all(map(operator.is_, fast.reader.last.carried, blocks))
    # IDLE_A2 exits; a new process takes its PID, in pod A: a new `<pid>` directory
    os.rename(node.proc / str(IDLE_A2), tmp_path / "exited")  # its inode stays taken
    node.processes[1] = dataclasses.replace(
        process(IDLE_A2, f"{A}/{CID}"), comm="reused", start_ticks=300
    )
    node.write()
    assert IDLE_A2 in both()
    both()
    # and now for good: A's block holds a process no longer listed
    del node.processes[1]
    node.write()
    both()
    carried = {pid for block in fast.reader.last.carried for pid in block.readings}
    assert carried == {IDLE_A, RUNS_B, IDLE_S}  # B does not run in this test
    # what either keeps per PID is bounded by the process table: nothing of the gone one
    reader, tracker = fast.reader.reader, fast.tracker
    listed = {IDLE_A, RUNS_B, IDLE_S}
    assert reader._previous.keys() == listed and reader._confirmed == listed
    assert tracker._cache.keys() == listed and tracker._since.keys() <= listed


def test_a_pid_naming_a_new_process_has_its_cgroup_read_at_its_first_two_sightings(tmp_path):
    """A `cgroup` file is taken unread only once it read the same twice running; a PID
    that names a new process starts over (a new process may be moved into its
    container's cgroup just after it starts). IDLE_S's PID names a new process, in S at
    its first sighting and in pod A at its second: the fast reader sees it there too."""
    node = Node(tmp_path)
    (fast, counting), (full, _) = (
        node.engine(True, ScriptedClock()),
        node.engine(False, ScriptedClock()),
    )
    for _ in range(3):  # IDLE_S's cgroup confirmed, and carried
        read = pass_of_both(fast, full, counting)
    assert IDLE_S not in read
    os.rename(node.proc / str(IDLE_S), tmp_path / "exited")  # its inode stays taken
    new = dataclasses.replace(process(IDLE_S, S), comm="new", start_ticks=300)
    node.processes[3] = new
    node.write()
    assert IDLE_S in pass_of_both(fast, full, counting)
    node.processes[3] = dataclasses.replace(new, cgroup=f"0::/{A}/{CID}\n")
    node.write()
    pass_of_both(fast, full, counting)
    (moved,) = (r for r in every_process(fast.reader.last) if r.pid == IDLE_S)
    assert moved.cgroup == f"0::/{A}/{CID}\n".encode()


class FailOnce:
    """A tracker whose next `advance` fails once, as it takes the processes read (they
    come as an iterable that raises after the last one)."""

    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self.armed = False

    def __getattr__(self, name):
        return getattr(self.tracker, name)

    def advance(self, readings, *args):
        if self.armed:
            self.armed = False

            def failing(given):
                yield from given
                raise OSError("the pass fails midway")

            readings = failing(readings)
        return self.tracker.advance(readings, *args)


def test_a_pass_that_fails_after_its_read_loses_nothing_of_the_next(tmp_path):
    """A pass fails after the reader read it, in the guard. The reader keeps what it read
    (the next pass carries those very readings, which the guard never accepted); the
    guard keeps what it had. The next pass sums what a plain full read over the same
    failure sums, every process with its interval since the last pass that completed;
    and the totals are those of a run where no pass failed."""
    node = Node(tmp_path)
    (fast, _), (full, _) = node.engine(True, ScriptedClock()), node.engine(False, ScriptedClock())
    unfailing, _ = node.engine(False, ScriptedClock())
    fast.tracker, full.tracker = FailOnce(fast.tracker), FailOnce(full.tracker)
    run_b(node, 1)
    node.write()
    for engine in (fast, full, unfailing):
        engine.run_pass()
    # the second pass reads A's processes whole, and the third would carry them: it fails
    run_b(node, 2)
    node.write()
    for engine in (fast, full):
        engine.tracker.armed = True
        with pytest.raises(OSError):
            engine.run_pass()
    unfailing.run_pass()
    run_b(node, 3)
    node.write()
    ours, theirs = fast.run_pass(), full.run_pass()
    assert ours.carried_by_cgroup == 2  # A's, as read by the failed pass
    assert same_sums(ours, theirs)
    assert sum(f.processes for f in ours.intervals.values()) == 4

    def counts(totals):
        return {g: {k: v for k, v in t.items() if k != "observed_nanos"} for g, t in totals.items()}

    assert counts(ours.totals) == counts(unfailing.run_pass().totals)
    assert any(t["on_cpu_nanos"] for t in ours.totals.values())  # B ran

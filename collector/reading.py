"""The incremental reader: a pass that reads less on the evidence of the last one.

What a reading is, is defined by the plain reader (collector/plainread.py): every file
of every process. This reader keeps what the last pass saw of each process (`_ProcessSeen`)
and skips a read where a kernel fact proves its answer unchanged. Each shortcut is one
predicate below, its docstring the fact it rests on; `Reader` only applies them. The
readings equal the plain reader's (tests/unit/test_incremental.py, tests/unit/test_quiet_cgroups.py)
but for the kernel timing said at `in_quiet_cgroup`.

The bound: whatever a shortcut's fact misses (a kernel timing, a layout nobody foresaw),
every process is read whole, as the plain reader reads it, at least once every
`WHOLE_READ_PASSES` passes (`whole_read_due`, staggered by PID so that no pass pays it
all). The counters only grow, and the guard subtracts the last reading it was given, so
what a shortcut missed is counted at that read: at most that many passes late, never lost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, ItemsView
from dataclasses import replace
from typing import NamedTuple, TypeGuard

from collector.model import (
    WHOLE_READ_PASSES,
    IOBytes,
    ProcError,
    ProcessGone,
    ProcessReading,
    Stat,
    ThreadReading,
    build,
    whole_read_due,
)
from collector.parse import (
    parse_io,
    parse_schedstat,
    parse_start_ticks,
    parse_stat,
    parse_status_switches,
)
from collector.procfs import ProcFS
from collector.readings import (
    Carried,
    Clock,
    Footprint,
    PassReadings,
    Unreadable,
    boottime_ns,
    collect,
)

__all__ = ["WHOLE_READ_PASSES", "Carried", "Footprint", "PassReadings", "Reader",
           "Unreadable", "boottime_ns"]  # fmt: skip


class _ThreadSeen(NamedTuple):
    """What a pass saw of a thread: its TID, its directory's inode, raw schedstat, reading."""

    tid: int
    ino: int
    schedstat: bytes
    reading: ThreadReading


class _ProcessSeen(NamedTuple):
    """What a pass saw of a process, kept for the next pass to read less."""

    ino: int  # of its `<pid>` directory
    reading: ProcessReading
    threads: list[_ThreadSeen]  # in TID order, as listed
    ran: int  # how many of its threads had run since the pass before
    io_totals: IOBytes | None  # the process's own `io`, read before its threads, if read


class _Probe(NamedTuple):
    """What a look at a maybe-quiet process read: its thread listing (None for a lone
    leader), the schedstat of each thread read before the look stopped, and whether it
    proved the process quiet. A process not proved quiet is read whole, with these."""

    listing: list[tuple[int, int]] | None
    schedstats: dict[int, bytes]
    quiet: bool


class _Threads(NamedTuple):
    """A process's threads as read this pass, and what the next pass needs of them."""

    readings: list[ThreadReading]
    seen: list[_ThreadSeen]
    ran: int
    io_totals: IOBytes | None


class _Block(NamedTuple):
    """The processes of one quiet cgroup carried over together (`Carried`); what carrying
    is, told once for this module.

    A known process (`known_since`) of a quiet cgroup (`in_quiet_cgroup`), not due to be
    read whole, is carried without reading any file: its last reading, the very object,
    stands for one instant of the pass (`PassReadings.carried_at_ns`: any instant of the
    pass is theirs, nothing of theirs moved in it), apart from the processes read, in one
    block per cgroup (`PassReadings.carried`), so that the guard and the sums take them as
    a block. The next pass carries the block again as it is, without a look at each of its
    processes, where `block_stands`, less its members due to be read whole (by PID modulo
    K), which are read whole while the rest make a new block: an idle pod costs a look at
    its block, not at each of its processes. Kept for that: each member's `<pid>` inode,
    and which members each pass reads whole."""

    carried: Carried
    inos: dict[int, int]  # pid → inode of its `<pid>` directory when it was last listed
    due: dict[int, list[int]]  # pid % K → those PIDs (empty where there is no bound)

    @staticmethod
    def of(
        cgroup: bytes, members: dict[int, tuple[int, ProcessReading]], every: int | None
    ) -> _Block:
        """A block of `members` (pid → (inode, last reading)), all of cgroup `cgroup`."""
        readings = {pid: reading for pid, (_, reading) in members.items()}
        due: dict[int, list[int]] = {}
        if every is not None:
            for pid in readings:
                due.setdefault(pid % every, []).append(pid)
        carried = Carried(
            cgroup,
            readings,
            sum(len(r.threads) for r in readings.values()),
            sum(r.rss_bytes for r in readings.values()),
        )
        return _Block(carried, {pid: ino for pid, (ino, _) in members.items()}, due)

    def members(self) -> dict[int, tuple[int, ProcessReading]]:
        readings = self.carried.readings
        return {pid: (ino, readings[pid]) for pid, ino in self.inos.items()}


_NO_PROBE = _Probe(None, {}, False)
_LEADER = -1  # the inode stand-in of a leader known by its process's start time

# -- the shortcuts, each the kernel fact it rests on ---------------------------------------


def same_thread(old: _ThreadSeen | None, ino: int) -> TypeGuard[_ThreadSeen]:
    """The thread listed under `task/<tid>` with inode `ino` is the one seen last pass.

    Kernel fact: procfs gives each `task/<tid>` directory a fresh inode number when it
    creates the thread (`ProcFS.threads`), so the same TID under the same inode is the
    same thread, not a reuse of its TID: its start time is known, its `stat` not read.
    """
    return old is not None and old.ino == ino


def did_not_run(old: _ThreadSeen, schedstat: bytes) -> bool:
    """The thread neither ran nor waited since last pass: its reading stands.

    Kernel fact: `schedstat` holds the thread's on-CPU time, run delay and run count,
    each only growing; the same bytes mean none moved, so nothing charged to the thread
    (switches, storage bytes) moved either. A run count of 0 is no evidence: a kernel
    that keeps no sched_info prints `0 0 0` for every thread, however much it ran.
    """
    return old.schedstat == schedstat and old.reading.timeslices > 0


def only_waited(before: ThreadReading, on_cpu_ns: int, timeslices: int) -> bool:
    """The thread has not run since last pass (its run delay may have grown).

    Kernel fact: context switches and storage bytes are counted in the thread's own
    context, which needs it on a CPU; with its on-CPU time and run count unchanged it
    was not, so its `status` and `io` are not read. (Both are needed: `schedstat` prints
    the on-CPU time last charged, at a tick or a switch, so a thread picked since the
    last pass and still on its CPU shows the same on-CPU time; its run count moved when
    it was picked. A run count of 0 is no evidence, as for `did_not_run`.)
    """
    return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices > 0


def io_unmoved(io_totals: IOBytes | None, previous: _ProcessSeen) -> bool:
    """No thread of the process moved a storage byte since last pass.

    Kernel fact: a process's own `io` is the sum of its live threads', its exited
    threads' and its reaped children's, all counters that only grow; equal totals mean
    none grew. (The totals are read before any thread, so every thread reading kept last
    pass is later than last pass's totals.)
    """
    return io_totals is not None and io_totals == previous.io_totals


def known_since(
    previous: _ProcessSeen | None, ino: int, confirmed: bool
) -> TypeGuard[_ProcessSeen]:
    """The process listed now is the one last pass saw, and its cgroup is settled: the
    same `<pid>` directory inode (procfs gives a new process a fresh one) and a `cgroup`
    file read the same twice running (or carried since). Every whole-process shortcut
    starts here."""
    return previous is not None and previous.ino == ino and confirmed


def in_quiet_cgroup(previous: _ProcessSeen, quiet: Callable[[bytes], bool]) -> bool:
    """Whether a known process is in a cgroup that has not run since it was last read:
    its cgroup's CPU usage did not move (`quiet`, decided by the caller with the cgroup
    read before this pass and the one read before that process's last reading).

    Kernel fact: a cgroup's CPU usage (v2 `cpu.stat` `usage_usec`, v1 `cpuacct.usage`)
    is charged whenever any of its tasks runs (`update_curr`), and every counter read
    here — on-CPU time and the ticks it is scaled to, context switches, storage bytes,
    major faults, thread starts and exits — moves only while a task of the process runs.
    Two timings can leave usage still while a counter moved: v2 usage is in µs (less
    than a µs of running), and a thread picked just before the read but not yet charged
    has its run delay and run count moved. Both are read at the next pass that reads the
    process: deferred, never lost (the guard compares with the last reading it got).

    The process's cgroup is the one its `cgroup` file said when last read (at most
    `WHOLE_READ_PASSES` passes ago, as for every attribution): a process moved out of a
    quiet cgroup since is read when it is next read whole, and counted then. The caller
    also checks that the cgroup whose usage stood still holds the process (its path in
    that hierarchy), not merely names its group.
    """
    return quiet(previous.reading.cgroup)


def block_stands(
    block: _Block, listed: ItemsView[int, int], quiet: Callable[[bytes], bool]
) -> bool:
    """Whether the processes carried last pass as one block may be carried again as one,
    without a look at each: every one of them is listed now under the same `<pid>` inode,
    and their cgroup is quiet.

    This is `known_since` and `in_quiet_cgroup` for each of them at once: a block only
    ever holds processes that passed both (carried one by one, then kept together), none
    of them read since, so each one's cgroup is still settled and the same; the inodes
    (one set comparison, `listed` being this pass's listing) prove each the same process
    as last pass's. A member gone, or listed under a new inode, and the block is looked
    at process by process, as any carried process is.
    """
    return block.inos.items() <= listed and quiet(block.carried.cgroup)


class Reader:
    """Reads every process of a `ProcFS`, stamping each reading with `clock()`, reading
    less where a shortcut above proves the answer:

    * A process: `known_since` (the same one, its cgroup settled) opens every shortcut
      below that skips a whole process.
    * A thread: `same_thread` (its `stat` not read), `did_not_run` (nothing more read),
      `only_waited` (its `status` and `io` not read), `io_unmoved` (its `io` not read).
    * A quiet process — listed under the same `<pid>` inode, none of its threads ran in
      the last pass, the same threads now and each `did_not_run` — has not run: its
      `stat` counters cannot have moved, and its reading is the last one at a new
      instant (`_probe`, `_carry`).
    * A process in a quiet cgroup (`read_pass(quiet=…)`, `in_quiet_cgroup`) is carried
      without reading any file, in its cgroup's block (`_Block`).
    * A process's `cgroup` is read at its first two sightings (a new process may be moved
      into its container's cgroup just after it starts), then when it is read whole.
    * Every process is read whole, no shortcut taken, when `whole_read_due`: the bound
      of every shortcut above (K = `WHOLE_READ_PASSES` passes).
    """

    def __init__(
        self,
        procfs: ProcFS,
        clock: Clock = boottime_ns,
        page_size: int | None = None,
        whole_read_passes: int | None = WHOLE_READ_PASSES,
    ):
        self.procfs = procfs
        # K; None only to measure what the bound costs (the bench), never to run
        self.whole_read_passes = whole_read_passes
        self.clock = clock
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        # What the last pass saw of each process, and which PIDs have a settled cgroup;
        # both kept in place from pass to pass (a carried process's entry untouched)
        self._previous: dict[int, _ProcessSeen] = {}
        self._confirmed: set[int] = set()  # PIDs whose cgroup read the same twice running
        self._blocks: dict[bytes, _Block] = {}  # last pass's carried blocks, by cgroup
        self._passes = 0

    def read_pass(self, quiet: Callable[[bytes], bool] | None = None) -> PassReadings:
        """Every process listed now. `quiet(cgroup_text)` says whether a process whose
        cgroup file reads so is in a cgroup that has not run since the previous pass (see
        `in_quiet_cgroup`); its known processes are then carried over unread, by block
        (`_Block`)."""
        self._passes += 1
        previous_pass, confirmed = self._previous, self._confirmed
        listed_at = self.clock()
        listed = self.procfs.processes()
        present = dict(listed)
        gone = previous_pass.keys() - present.keys()
        for pid in gone:
            del previous_pass[pid]
        confirmed.difference_update(gone)

        def read(pid: int, ino: int) -> ProcessReading:
            was_confirmed = pid in confirmed
            confirmed.discard(pid)
            seen, cgroup_confirmed = self._read_process(
                pid, ino, previous_pass.pop(pid, None), was_confirmed
            )
            previous_pass[pid] = seen
            if cgroup_confirmed:
                confirmed.add(pid)
            return seen.reading

        blocks: dict[bytes, _Block] = {}
        if quiet is not None:
            listed = self._carry_blocks(listed, present, quiet, blocks)
        self._blocks = blocks
        carried_at = self.clock() if blocks else None
        readings = collect(listed_at, listed, read, self.clock)
        if not blocks:
            return readings
        carried = tuple(block.carried for block in blocks.values())
        return replace(readings, carried=carried, carried_at_ns=carried_at)

    def _carry_blocks(
        self,
        listed: list[tuple[int, int]],
        present: dict[int, int],
        quiet: Callable[[bytes], bool],
        blocks: dict[bytes, _Block],
    ) -> list[tuple[int, int]]:
        """Fill `blocks` with this pass's carried processes, by cgroup (`_Block`); what is
        left to read: last pass's blocks that stand first, then each listed process not in
        one."""
        passes, every, previous_pass = self._passes, self.whole_read_passes, self._previous
        kept: set[int] = set()
        block: _Block | None  # last pass's, then (below) the one a joining cgroup has
        members: dict[int, tuple[int, ProcessReading]] | None
        due_now = None if every is None else -passes % every  # pid % K of those due
        listed_items = present.items()
        for cgroup, block in self._blocks.items():
            if not block_stands(block, listed_items, quiet):
                continue
            due = block.due.get(due_now) if due_now is not None else None
            if due:  # read whole this pass, apart from the block
                members = block.members()
                for pid in due:
                    del members[pid]
                if not members:
                    continue
                block = _Block.of(cgroup, members, every)
            blocks[cgroup] = block
            kept.update(block.inos)
        rest = [entry for entry in listed if entry[0] not in kept] if kept else listed
        confirmed = self._confirmed
        to_read: list[tuple[int, int]] = []
        joining: dict[bytes, dict[int, tuple[int, ProcessReading]]] = {}
        for pid, ino in rest:
            previous = previous_pass.get(pid)
            if (
                whole_read_due(pid, passes, every)
                or not known_since(previous, ino, pid in confirmed)
                or not in_quiet_cgroup(previous, quiet)
            ):
                to_read.append((pid, ino))
                continue
            # its last sighting stands, its reading for this pass's carried instant (its
            # `ran` is older than this pass: at worst a whole read where a probe would do)
            cgroup = previous.reading.cgroup
            members = joining.get(cgroup)
            if members is None:
                members = joining[cgroup] = {}
            members[pid] = (ino, previous.reading)
        for cgroup, members in joining.items():
            block = blocks.get(cgroup)
            blocks[cgroup] = _Block.of(
                cgroup, members if block is None else block.members() | members, every
            )
        return to_read

    def read_process(self, pid: int) -> ProcessReading:
        """One process, whole, from scratch. Raises ProcessGone, or Unreadable."""
        return self._read_process(pid, 0, None, False)[0].reading

    def _read_process(
        self, pid: int, ino: int, previous: _ProcessSeen | None, confirmed: bool
    ) -> tuple[_ProcessSeen, bool]:
        """This pass's sighting of a process, and whether its cgroup is now confirmed
        (read the same twice running, or carried since). `previous`: what the last pass
        saw of this PID. (A process of a quiet cgroup was carried by
        `read_pass` before this.)"""
        whole = whole_read_due(pid, self._passes, self.whole_read_passes)
        probe = _NO_PROBE
        # Not after a read with no probe: that read took `stat` before its threads'
        # `schedstat`, so a thread that ran in between left `stat` behind, and such a
        # read counts each thread that moved, or every thread if read whole, as having run.
        if known_since(previous, ino, confirmed) and not whole and not previous.ran:
            probe = self._probe(pid, previous)
            if probe.quiet:
                return self._carry(pid, previous, self.clock()), True
        procfs = self.procfs
        try:
            stat = parse_stat(procfs.process_file(pid, "stat"))
            at_ns = self.clock()
            if previous is not None and previous.reading.start_ticks != stat.start_ticks:
                previous = None  # another process under this PID
            if previous is not None and confirmed and not whole:
                cgroup, cgroup_confirmed = previous.reading.cgroup, True
            else:
                cgroup = procfs.process_file(pid, "cgroup")
                cgroup_confirmed = previous is not None and previous.reading.cgroup == cgroup
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(None, error) from None
        rss_bytes = stat.rss_pages * self.page_size
        try:
            # read whole: every thread as if never seen, every file of it read (and each
            # counted as having run: the next pass reads this `stat` rather than probing)
            threads = self._read_threads(pid, stat, None if whole else previous, probe)
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(Footprint(pid, cgroup, stat.num_threads, rss_bytes), error) from None
        if not threads.readings:
            raise ProcessGone(f"pid {pid}: every thread exited mid-read")
        reading = build(
            ProcessReading,
            (pid, stat.comm, stat.start_ticks, at_ns, stat.utime_ticks, stat.stime_ticks,
             stat.major_faults, rss_bytes, cgroup, tuple(threads.readings)),
        )  # fmt: skip
        seen = build(_ProcessSeen, (ino, reading, threads.seen, threads.ran, threads.io_totals))
        return seen, cgroup_confirmed

    def _probe(self, pid: int, previous: _ProcessSeen) -> _Probe:
        """Whether a process none of whose threads ran last pass is still quiet: the
        same threads under the same inodes (`same_thread`; both lists in TID order) and
        each `did_not_run`. A lone leader that did not run started no thread: its
        `task/` is not listed."""
        known = previous.threads
        listing = None
        schedstats: dict[int, bytes] = {}
        try:
            if len(known) != 1 or known[0].ino != _LEADER:
                listing = self.procfs.threads(pid)
                if len(listing) != len(known) or not all(
                    old.tid == tid and same_thread(old, ino)
                    for (tid, ino), old in zip(listing, known, strict=True)
                ):
                    return _Probe(listing, schedstats, False)
            read = self.procfs.read
            task = self.procfs.task_dir(pid)
            for old in known:
                raw = schedstats[old.tid] = read(b"%s%d/schedstat" % (task, old.tid))
                if not did_not_run(old, raw):
                    return _Probe(listing, schedstats, False)
        except ProcError:  # gone, refused or malformed: the whole read says which
            return _Probe(listing, schedstats, False)
        return _Probe(listing, schedstats, True)

    @staticmethod
    def _carry(pid: int, previous: _ProcessSeen, at_ns: int) -> _ProcessSeen:
        """The last pass's reading of a process that has not run since, at instant `at_ns`."""
        last = previous.reading
        reading = build(
            ProcessReading,
            (pid, last.comm, last.start_ticks, at_ns, last.utime_ticks,
             last.stime_ticks, last.major_faults, last.rss_bytes, last.cgroup, last.threads),
        )  # fmt: skip
        return build(_ProcessSeen, (previous.ino, reading, previous.threads, 0, None))

    def _read_threads(
        self, pid: int, stat: Stat, previous: _ProcessSeen | None, probe: _Probe
    ) -> _Threads:
        """Every thread of a process; the hot loop of a pass, so written for speed.

        What a probe read this pass (its listing, its schedstats) is used, not read again.
        A process whose `stat` counts one thread is its own only thread, the leader, known
        by the process's start time: its `task/` directory is not listed. (A thread born
        just after that `stat` read is seen from the next pass, as any mid-read birth.)
        """
        procfs = self.procfs
        read = procfs.read
        task = procfs.task_dir(pid)
        readings: list[ThreadReading] = []
        memo: list[_ThreadSeen] = []
        process_start = stat.start_ticks
        if stat.num_threads == 1:
            listing = [(pid, _LEADER)]
        else:
            listing = probe.listing or procfs.threads(pid)
        schedstats = probe.schedstats
        if previous is None:
            known: list[_ThreadSeen] = []
            io_totals = None
            keep_io = False
        else:
            known = previous.threads
            # Read before any thread (see `io_unmoved`), and only for processes whose
            # threads ran last pass, where it can save an `io` read per thread. A probe
            # never precedes it: a probed process had no thread that ran.
            io_totals = (
                parse_io(procfs.process_file(pid, "io"))
                if previous.ran > 1 and len(listing) > 1
                else None
            )
            keep_io = io_unmoved(io_totals, previous)
        ran = 0
        by_tid: dict[int, _ThreadSeen] | None = None  # made on the first misplaced thread
        count = len(known)
        for position, (tid, ino) in enumerate(listing):
            try:
                base = b"%s%d/" % (task, tid)
                raw = schedstats.get(tid) if schedstats else None
                if raw is None:
                    raw = read(base + b"schedstat")
                # Last pass's sighting: at the same position unless a thread came or went.
                old = known[position] if position < count else None
                if old is None or old.tid != tid:
                    if by_tid is None:
                        by_tid = {seen.tid: seen for seen in known}
                    old = by_tid.get(tid)
                if same_thread(old, ino):
                    if did_not_run(old, raw):
                        readings.append(old.reading)
                        memo.append(old)
                        continue
                    before = old.reading
                    start = before.start_ticks
                else:
                    before = None
                    # The leader's start time is the process's own: no second `stat` read.
                    start = process_start if tid == pid else parse_start_ticks(read(base + b"stat"))
                on_cpu, run_delay, timeslices = parse_schedstat(raw)
                if before is not None and only_waited(before, on_cpu, timeslices):
                    voluntary = before.voluntary_switches
                    nonvoluntary = before.nonvoluntary_switches
                    read_bytes, write_bytes = before.read_bytes, before.write_bytes
                else:
                    ran += 1
                    voluntary, nonvoluntary = parse_status_switches(read(base + b"status"))
                    if keep_io and before is not None:
                        read_bytes, write_bytes = before.read_bytes, before.write_bytes
                    else:
                        read_bytes, write_bytes = parse_io(read(base + b"io"))
                reading = build(
                    ThreadReading,
                    (tid, start, on_cpu, run_delay, timeslices, voluntary, nonvoluntary,
                     read_bytes, write_bytes),
                )  # fmt: skip
            except ProcessGone:
                continue  # a thread that exits mid-read is simply not seen this pass
            readings.append(reading)
            memo.append(build(_ThreadSeen, (tid, ino, raw, reading)))
        return build(_Threads, (readings, memo, ran, io_totals))

"""One pass over the process table: `ProcFS` bytes in, typed readings out.

A process is read whole or not at all: `stat` (the start time and the instant of the
reading come from the same moment), `cgroup`, then every thread's `schedstat`,
`status` and `io`. A process that vanishes mid-read is counted as vanished; one that
cannot be read (permission, malformed text) as unreadable. Neither stops the pass.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from collector.model import (
    AccessDenied,
    IOBytes,
    ProcError,
    ProcessGone,
    ProcessReading,
    Stat,
    ThreadReading,
    build,
)
from collector.parse import (
    parse_io,
    parse_schedstat,
    parse_start_ticks,
    parse_stat,
    parse_status_switches,
)
from collector.procfs import ProcFS

log = logging.getLogger(__name__)

Clock = Callable[[], int]


def boottime_ns() -> int:
    """CLOCK_BOOTTIME in ns: the clock `/proc/<pid>/stat` start times are counted on."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Footprint(NamedTuple):
    """What a pass saw of a process, delta or not: its cgroup, threads and resident memory."""

    pid: int
    cgroup: bytes
    threads: int
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class PassReadings:
    """Everything one pass read. `listed_at_ns` is the instant the pass began listing."""

    listed_at_ns: int
    processes: tuple[ProcessReading, ...]
    footprints: tuple[Footprint, ...]
    vanished: int
    unreadable: int
    denied: int
    carried_by_cgroup: int = 0  # processes carried over unread: their cgroup was quiet


class _ThreadSeen(NamedTuple):
    """What a pass saw of a thread: its TID, its directory's inode, raw schedstat, reading."""

    tid: int
    ino: int
    schedstat: bytes
    reading: ThreadReading


class _Seen(NamedTuple):
    """What a pass saw of a process, kept for the next pass to read less."""

    ino: int  # of its `<pid>` directory
    reading: ProcessReading
    threads: list[_ThreadSeen]  # in TID order, as listed
    ran: int  # how many of its threads had run since the pass before
    io_totals: IOBytes | None  # the process's own `io`, read before its threads, if read


@dataclass(slots=True)
class _Early:
    """What an attempt at reading a process as quiet read before it gave up."""

    listing: list[tuple[int, int]] | None
    schedstats: dict[int, bytes]


_NOTHING_EARLY = _Early(None, {})  # never written to: a quiet attempt gets its own


class Unreadable(ProcError):
    """A process that could not be read whole; carries what was seen of it, if anything."""

    def __init__(self, footprint: Footprint | None, cause: ProcError):
        super().__init__(str(cause))
        self.footprint = footprint
        self.cause = cause


_LEADER = -1  # the inode stand-in of a leader known by its process's start time

CGROUP_REVALIDATE_PASSES = 8
"""A process's cgroup file is re-read at least every this many passes (see `Reader`)."""


def in_quiet_cgroup(previous: _Seen, quiet: Callable[[bytes], bool]) -> bool:
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
    `CGROUP_REVALIDATE_PASSES` passes ago, as for every attribution): a process moved
    out of a quiet cgroup since is read when that file is read again.
    """
    return quiet(previous.reading.cgroup)


class Reader:
    """Reads every process of a `ProcFS`, stamping each reading with `clock()`.

    Incremental by default: it keeps the previous pass's readings and reads less where
    the kernel's counters prove nothing changed, with results identical to a full read:

    * A thread listed under the same `task/<tid>` inode as last pass is the same thread
      (see `ProcFS.threads`): its start time is known, its `stat` is not read again.
    * A thread whose schedstat (on-CPU time and run count) did not move has not run, so
      its context switches and I/O bytes cannot have moved (they are counted only in the
      thread's own context): its `status` and `io` are not read again.
    * A process whose threads ran in the last pass has its own `io` read before its
      threads: the kernel sums it from every live thread plus the threads that exited
      and the children reaped, all of them counters that only grow, so if it equals the
      last pass's, no thread's storage bytes moved and threads that ran keep theirs
      (the thread readings it is compared against were all taken after it, last pass).
    * A process's `cgroup` is read at its first two sightings (a new process may be moved
      into its container's cgroup just after it starts) and then every
      `CGROUP_REVALIDATE_PASSES` passes, staggered by PID, instead of every pass.
      A process migrated to another cgroup later in its life is seen there within that
      many passes.
    * A quiet process — listed under the same `<pid>` inode, none of its threads ran in
      the last pass, the same threads now and none of their schedstat moved — has not
      run: its `stat` counters (CPU ticks, faults, thread count) cannot have moved, and
      its `stat` is not read; its reading is the last one at a new instant. Its resident
      memory (which reclaim can shrink while it sleeps) and its name are refreshed with
      its cgroup, every `CGROUP_REVALIDATE_PASSES` passes.
    * A process in a quiet cgroup (`read_pass(quiet=…)`, see `in_quiet_cgroup`) is
      carried over the same way, without reading any of its files; its periodic refresh
      reads its `stat` and `cgroup` only, its threads carried.

    Those two refreshes are the only places it can lag a full read, with one kernel
    timing said at `in_quiet_cgroup`.

    `incremental=False` reads every file every pass (the tests compare the two).
    """

    def __init__(
        self,
        procfs: ProcFS,
        clock: Clock = boottime_ns,
        page_size: int | None = None,
        incremental: bool = True,
    ):
        self.procfs = procfs
        self.clock = clock
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self.incremental = incremental
        self._previous: dict[int, _Seen] = {}
        self._confirmed: set[int] = set()  # PIDs whose cgroup read the same twice running
        self._passes = 0
        self._quiet: Callable[[bytes], bool] | None = None
        self._carried = 0  # processes carried over by a quiet cgroup, this pass

    def read_pass(self, quiet: Callable[[bytes], bool] | None = None) -> PassReadings:
        """Every process listed now. `quiet(cgroup_text)` says whether a process whose
        cgroup file reads so is in a cgroup that has not run since the previous pass (see
        `in_quiet_cgroup`); its known processes are then carried over unread."""
        self._passes += 1
        self._quiet = quiet if self.incremental else None
        listed_at = self.clock()
        listed = self.procfs.processes()
        readings: list[ProcessReading] = []
        footprints: list[Footprint] = []
        vanished = unreadable = denied = 0
        previous_pass = self._previous if self.incremental else {}
        confirmed_before, self._confirmed = self._confirmed, set()
        current: dict[int, _Seen] = {}
        for pid, ino in listed:
            try:
                seen = self._read_process(pid, ino, previous_pass.get(pid), pid in confirmed_before)
            except ProcessGone:
                vanished += 1
                continue
            except Unreadable as error:
                unreadable += 1
                if isinstance(error.cause, AccessDenied):
                    denied += 1
                else:
                    log.debug("pid %d unreadable: %s", pid, error.cause)
                if error.footprint is not None:
                    footprints.append(error.footprint)
                continue
            reading = seen.reading
            readings.append(reading)
            current[pid] = seen
            footprints.append(
                build(Footprint, (pid, reading.cgroup, len(reading.threads), reading.rss_bytes))
            )
        self._previous = current
        carried, self._carried = self._carried, 0
        return PassReadings(
            listed_at_ns=listed_at,
            processes=tuple(readings),
            footprints=tuple(footprints),
            vanished=vanished,
            unreadable=unreadable,
            denied=denied,
            carried_by_cgroup=carried,
        )

    def read_process(self, pid: int) -> ProcessReading:
        """One process, whole, from scratch. Raises ProcessGone, or Unreadable."""
        return self._read_process(pid, 0, None, False).reading

    def _read_process(self, pid: int, ino: int, previous: _Seen | None, confirmed: bool) -> _Seen:
        """`previous` is what the last pass saw of this PID; used only for the same process."""
        procfs = self.procfs
        revalidate = not (pid + self._passes) % CGROUP_REVALIDATE_PASSES
        early = _NOTHING_EARLY
        if (
            previous is not None
            and previous.ino == ino
            and confirmed
            and self._quiet is not None
            and in_quiet_cgroup(previous, self._quiet)
        ):
            carried = self._refresh(pid, previous) if revalidate else self._carry(pid, previous)
            if carried is not None:
                self._confirmed.add(pid)
                self._carried += 1
                return carried
        if (
            previous is not None
            and previous.ino == ino
            and not previous.ran
            and confirmed
            and not revalidate
        ):
            early = _Early(None, {})
            quiet = self._read_quiet(pid, previous, early)
            if quiet is not None:
                self._confirmed.add(pid)
                return quiet
        try:
            stat = parse_stat(procfs.process_file(pid, "stat"))
            at_ns = self.clock()
            if previous is not None and previous.reading.start_ticks != stat.start_ticks:
                previous = None
            if previous is not None and confirmed and not revalidate:
                cgroup = previous.reading.cgroup
                self._confirmed.add(pid)
            else:
                cgroup = procfs.process_file(pid, "cgroup")
                if previous is not None and previous.reading.cgroup == cgroup:
                    self._confirmed.add(pid)
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(None, error) from None
        rss_bytes = stat.rss_pages * self.page_size
        try:
            threads, memo, ran, io_totals = self._read_threads(pid, stat, previous, early)
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(Footprint(pid, cgroup, stat.num_threads, rss_bytes), error) from None
        if not threads:
            raise ProcessGone(f"pid {pid}: every thread exited mid-read")
        reading = build(
            ProcessReading,
            (pid, stat.comm, stat.start_ticks, at_ns, stat.utime_ticks, stat.stime_ticks,
             stat.major_faults, rss_bytes, cgroup, tuple(threads)),
        )  # fmt: skip
        return build(_Seen, (ino, reading, memo, ran, io_totals))

    def _read_quiet(self, pid: int, previous: _Seen, early: _Early) -> _Seen | None:
        """The last pass's reading at a new instant if the process has not run since
        (the same threads, no schedstat moved); None if it may have: read it whole,
        with what `early` kept of this attempt (its listing, the schedstats read)."""
        known = previous.threads
        try:
            if len(known) != 1 or known[0].ino != _LEADER:
                # Not a lone leader: the same threads, under the same inodes, or no
                # (both lists in TID order).
                listing = early.listing = self.procfs.threads(pid)
                if len(listing) != len(known):
                    return None
                for (tid, ino), old in zip(listing, known, strict=True):
                    if old.tid != tid or old.ino != ino:
                        return None
            # (A lone leader that did not run started no thread: no listing needed.)
            read = self.procfs.read
            task = self.procfs.task_dir(pid)
            schedstats = early.schedstats
            for old in known:
                tid = old.tid
                raw = schedstats[tid] = read(b"%s%d/schedstat" % (task, tid))
                if raw != old.schedstat:
                    return None
        except ProcError:
            return None  # gone, refused or malformed: the whole read says which
        return self._carry(pid, previous)

    def _refresh(self, pid: int, previous: _Seen) -> _Seen | None:
        """The periodic refresh of a process carried by its quiet cgroup: its `stat` (for
        its resident memory and name) and its `cgroup` read again, its threads carried.
        None — read it whole — if it moved to another cgroup or its `stat` counters moved
        (it ran: it cannot have, in a quiet cgroup, unless it left it)."""
        procfs = self.procfs
        last = previous.reading
        try:
            stat = parse_stat(procfs.process_file(pid, "stat"))
            at_ns = self.clock()
            cgroup = procfs.process_file(pid, "cgroup")
        except ProcError:
            return None  # gone, refused or malformed: the whole read says which
        if (
            cgroup != last.cgroup
            or stat.start_ticks != last.start_ticks
            or stat.utime_ticks != last.utime_ticks
            or stat.stime_ticks != last.stime_ticks
            or stat.major_faults != last.major_faults
            or stat.num_threads != len(last.threads)
        ):
            return None
        reading = build(
            ProcessReading,
            (pid, stat.comm, last.start_ticks, at_ns, last.utime_ticks, last.stime_ticks,
             last.major_faults, stat.rss_pages * self.page_size, last.cgroup, last.threads),
        )  # fmt: skip
        return build(_Seen, (previous.ino, reading, previous.threads, 0, None))

    def _carry(self, pid: int, previous: _Seen) -> _Seen:
        """The last pass's reading of a process that has not run since, at a new instant."""
        last = previous.reading
        reading = build(
            ProcessReading,
            (pid, last.comm, last.start_ticks, self.clock(), last.utime_ticks,
             last.stime_ticks, last.major_faults, last.rss_bytes, last.cgroup, last.threads),
        )  # fmt: skip
        return build(_Seen, (previous.ino, reading, previous.threads, 0, None))

    def _read_threads(
        self, pid: int, stat: Stat, previous: _Seen | None, early: _Early
    ) -> tuple[list[ThreadReading], list[_ThreadSeen], int, IOBytes | None]:
        """Every thread of a process; the hot loop of a pass, so written for speed.

        Returns the thread readings and what the next pass needs: the threads seen, how
        many had run, and the process's `io` totals if they were read. What a failed
        quiet attempt read this pass (`early`) is used, not read again.

        A process whose `stat` counts one thread is its own only thread, the leader, known
        by the process's start time: its `task/` directory is not listed. (A thread born
        just after that `stat` read is seen from the next pass, as any mid-read birth.)
        """
        procfs = self.procfs
        read = procfs.read
        task = procfs.task_dir(pid)
        keep = self.incremental
        threads: list[ThreadReading] = []
        memo: list[_ThreadSeen] = []
        process_start = stat.start_ticks
        # After a failed quiet attempt, its listing and schedstats are not read again.
        # (Such an attempt never comes with `io` totals, read only after a pass where
        # threads ran: their order, totals before any thread, holds.)
        if stat.num_threads == 1:
            listing = [(pid, _LEADER)]
        else:
            listing = early.listing or procfs.threads(pid)
        schedstats = early.schedstats
        if previous is None:
            known: list[_ThreadSeen] = []
            io_totals = None
            io_still = False
        else:
            known = previous.threads
            # Read before any thread, so that every thread reading kept this pass is
            # later than these totals. Next pass, equal totals then prove that nothing
            # grew since: a thread's kept bytes (read later than the totals, or carried
            # since, unmoved) are still its bytes. Read only for processes whose threads
            # ran last pass, where it can save an `io` read per thread.
            io_totals = (
                parse_io(procfs.process_file(pid, "io"))
                if previous.ran > 1 and len(listing) > 1
                else None
            )
            io_still = io_totals is not None and io_totals == previous.io_totals
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
                if old is not None and old.ino == ino:  # the same thread as last pass
                    if old.schedstat == raw:  # not run, not waited: nothing moved
                        threads.append(old.reading)
                        memo.append(old)
                        continue
                    before = old.reading
                    start = before.start_ticks
                else:
                    before = None
                    # The leader's start time is the process's own: no second `stat` read.
                    start = process_start if tid == pid else parse_start_ticks(read(base + b"stat"))
                on_cpu, run_delay, timeslices = parse_schedstat(raw)
                if (
                    before is not None
                    and before.on_cpu_ns == on_cpu
                    and before.timeslices == timeslices
                ):
                    # It has not run since (only waited): switches and I/O cannot have moved.
                    voluntary, nonvoluntary = (
                        before.voluntary_switches,
                        before.nonvoluntary_switches,
                    )
                    read_bytes, write_bytes = before.read_bytes, before.write_bytes
                else:
                    ran += 1
                    voluntary, nonvoluntary = parse_status_switches(read(base + b"status"))
                    if io_still and before is not None:
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
            threads.append(reading)
            if keep:
                memo.append(build(_ThreadSeen, (tid, ino, raw, reading)))
        return threads, memo, ran, io_totals

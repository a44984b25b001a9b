"""The plain reader: every file of every process, every pass, nothing remembered.

A process is read whole or not at all: its `stat` (the start time, and the instant of
the reading taken right after it), its `cgroup`, then for every thread listed under
`task/` that thread's `stat` (its start time), `schedstat`, `status` and `io`. A process
that vanishes mid-read is counted as vanished; one that cannot be read (permission,
malformed text) as unreadable; a thread that exits mid-read is not seen. None of it
stops the pass.

This is the definition of a reading. The collector runs the incremental reader
(collector/reading.py), which reads less on the evidence of the last pass; its readings
must equal these (tests/test_incremental.py, tests/test_quiet_cgroups.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from collector.model import (
    AccessDenied,
    ProcError,
    ProcessGone,
    ProcessReading,
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


class Carried(NamedTuple):
    """The processes of one cgroup carried over unread, as a block (collector/reading.py):
    their cgroup did not run, so no file of theirs was read. `readings`: each process's
    last reading, the very object, by PID. The footprint sums are the block's own, kept
    with it: a block that stands from pass to pass is the same object, summed in O(1)
    (`Tracker.advance`, `group_pass`)."""

    cgroup: bytes  # the `cgroup` file every one of them read when last read
    readings: Mapping[int, ProcessReading]
    threads: int
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class PassReadings:
    """Everything one pass read. `listed_at_ns` is the instant the pass began listing."""

    listed_at_ns: int
    processes: tuple[ProcessReading, ...]  # read (or proved quiet), each with a footprint
    footprints: tuple[Footprint, ...]
    vanished: int
    unreadable: int
    denied: int
    # Carried over, their cgroup quiet, no file of theirs read: their last readings, the
    # very objects, which stand for `carried_at_ns` (their own `at_ns` is when they were
    # read), in one block per cgroup. Their footprints are their own fields
    # (collector/aggregate.py sums them by block).
    carried: tuple[Carried, ...] = ()
    carried_at_ns: int | None = None
    # When every process listed was read and its tasks listed (a task missing from the
    # readings had exited by then: the exit records' guard, collector/tracker.py).
    read_until_ns: int | None = None

    @property
    def carried_by_cgroup(self) -> int:
        """The processes of which this pass read no file: their cgroup had not run."""
        return sum(len(block.readings) for block in self.carried)


class Unreadable(ProcError):
    """A process that could not be read whole; carries what was seen of it, if anything."""

    def __init__(self, footprint: Footprint | None, cause: ProcError):
        super().__init__(str(cause))
        self.footprint = footprint
        self.cause = cause


def read_thread(procfs: ProcFS, pid: int, tid: int) -> ThreadReading:
    """One thread's four files. Raises ProcessGone (it exited), or another ProcError."""
    base = b"%s%d/" % (procfs.task_dir(pid), tid)
    start = parse_start_ticks(procfs.read(base + b"stat"))
    on_cpu, run_delay, timeslices = parse_schedstat(procfs.read(base + b"schedstat"))
    voluntary, nonvoluntary = parse_status_switches(procfs.read(base + b"status"))
    read_bytes, write_bytes = parse_io(procfs.read(base + b"io"))
    return ThreadReading(
        tid, start, on_cpu, run_delay, timeslices, voluntary, nonvoluntary,
        read_bytes, write_bytes,
    )  # fmt: skip


def read_process(procfs: ProcFS, pid: int, clock: Clock, page_size: int) -> ProcessReading:
    """One process, whole. Raises ProcessGone (it exited), or Unreadable."""
    try:
        stat = parse_stat(procfs.process_file(pid, "stat"))
        at_ns = clock()
        cgroup = procfs.process_file(pid, "cgroup")
    except ProcessGone:
        raise
    except ProcError as error:
        raise Unreadable(None, error) from None
    rss_bytes = stat.rss_pages * page_size
    threads = []
    try:
        for tid, _ in procfs.threads(pid):
            try:
                threads.append(read_thread(procfs, pid, tid))
            except ProcessGone:
                continue  # a thread that exits mid-read is not seen this pass
    except ProcessGone:
        raise
    except ProcError as error:
        raise Unreadable(Footprint(pid, cgroup, stat.num_threads, rss_bytes), error) from None
    if not threads:
        raise ProcessGone(f"pid {pid}: every thread exited mid-read")
    return ProcessReading(
        pid, stat.comm, stat.start_ticks, at_ns, stat.utime_ticks, stat.stime_ticks,
        stat.major_faults, rss_bytes, cgroup, tuple(threads),
    )  # fmt: skip


def collect(
    listed_at_ns: int,
    listed: Iterable[tuple[int, int]],
    read: Callable[[int, int], ProcessReading],
    clock: Callable[[], int] | None = None,
) -> PassReadings:
    """Read each listed (pid, inode) with `read`, counting what could not be read; the
    pass read until `clock()` once every one was."""
    readings: list[ProcessReading] = []
    footprints: list[Footprint] = []
    vanished = unreadable = denied = 0
    for pid, ino in listed:
        try:
            reading = read(pid, ino)
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
        readings.append(reading)
        footprints.append(
            build(Footprint, (pid, reading.cgroup, len(reading.threads), reading.rss_bytes))
        )
    return PassReadings(
        listed_at_ns,
        tuple(readings),
        tuple(footprints),
        vanished,
        unreadable,
        denied,
        read_until_ns=None if clock is None else clock(),
    )


class PlainReader:
    """Reads every process of a `ProcFS` in full, stamping each reading with `clock()`."""

    def __init__(self, procfs: ProcFS, clock: Clock = boottime_ns, page_size: int | None = None):
        self.procfs = procfs
        self.clock = clock
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")

    def read_pass(self, quiet: Callable[[bytes], bool] | None = None) -> PassReadings:
        """Every process listed now (`quiet` is accepted, as the engine passes it, and
        ignored: this reader reads everything)."""
        listed_at = self.clock()
        return collect(
            listed_at, self.procfs.processes(), lambda pid, _: self.read_process(pid), self.clock
        )

    def read_process(self, pid: int) -> ProcessReading:
        return read_process(self.procfs, pid, self.clock, self.page_size)

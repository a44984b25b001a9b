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

from collector.model import (
    AccessDenied,
    ProcError,
    ProcessGone,
    ProcessReading,
    ThreadReading,
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


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a pass saw of a process, delta or not: its cgroup, threads and resident memory."""

    pid: int
    cgroup: bytes
    threads: int
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class PassReadings:
    """Everything one pass read. `listed_at_ns` is the instant the pass began listing."""

    listed_at_ns: int
    readings: tuple[ProcessReading, ...]
    footprints: tuple[Footprint, ...]
    vanished: int
    unreadable: int
    denied: int


class Unreadable(ProcError):
    """A process that could not be read whole; carries what was seen of it, if anything."""

    def __init__(self, footprint: Footprint | None, cause: ProcError):
        super().__init__(str(cause))
        self.footprint = footprint
        self.cause = cause


class Reader:
    """Reads every process of a `ProcFS`, stamping each reading with `clock()`."""

    def __init__(
        self,
        procfs: ProcFS,
        clock: Clock = boottime_ns,
        page_size: int | None = None,
    ):
        self.procfs = procfs
        self.clock = clock
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")

    def read_pass(self) -> PassReadings:
        listed_at = self.clock()
        pids = self.procfs.pids()
        readings: list[ProcessReading] = []
        footprints: list[Footprint] = []
        vanished = unreadable = denied = 0
        for pid in pids:
            try:
                reading = self.read_process(pid)
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
                Footprint(pid, reading.cgroup, len(reading.threads), reading.rss_bytes)
            )
        return PassReadings(
            listed_at_ns=listed_at,
            readings=tuple(readings),
            footprints=tuple(footprints),
            vanished=vanished,
            unreadable=unreadable,
            denied=denied,
        )

    def read_process(self, pid: int) -> ProcessReading:
        """One process, whole. Raises ProcessGone, or Unreadable with what was seen."""
        procfs = self.procfs
        try:
            stat = parse_stat(procfs.process_file(pid, "stat"))
            at_ns = self.clock()
            cgroup = procfs.process_file(pid, "cgroup")
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(None, error) from None
        rss_bytes = stat.rss_pages * self.page_size
        try:
            threads = self._read_threads(pid, stat.start_ticks)
        except ProcessGone:
            raise
        except ProcError as error:
            raise Unreadable(Footprint(pid, cgroup, stat.num_threads, rss_bytes), error) from None
        if not threads:
            raise ProcessGone(f"pid {pid}: every thread exited mid-read")
        return ProcessReading(
            pid=pid,
            comm=stat.comm,
            start_ticks=stat.start_ticks,
            at_ns=at_ns,
            utime_ticks=stat.utime_ticks,
            stime_ticks=stat.stime_ticks,
            major_faults=stat.major_faults,
            rss_bytes=rss_bytes,
            cgroup=cgroup,
            threads=threads,
        )

    def _read_threads(self, pid: int, process_start: int) -> tuple[ThreadReading, ...]:
        procfs = self.procfs
        threads = []
        for tid in procfs.tids(pid):
            try:
                # The leader's start time is the process's own: no second `stat` read.
                start = (
                    process_start
                    if tid == pid
                    else parse_start_ticks(procfs.thread_file(pid, tid, "stat"))
                )
                sched = parse_schedstat(procfs.thread_file(pid, tid, "schedstat"))
                switches = parse_status_switches(procfs.thread_file(pid, tid, "status"))
                io = parse_io(procfs.thread_file(pid, tid, "io"))
            except ProcessGone:
                continue  # a thread that exits mid-read is simply not seen this pass
            threads.append(
                ThreadReading(
                    tid=tid,
                    start_ticks=start,
                    on_cpu_ns=sched.on_cpu_ns,
                    run_delay_ns=sched.run_delay_ns,
                    timeslices=sched.timeslices,
                    voluntary_switches=switches.voluntary,
                    nonvoluntary_switches=switches.nonvoluntary,
                    read_bytes=io.read_bytes,
                    write_bytes=io.write_bytes,
                )
            )
        return tuple(threads)

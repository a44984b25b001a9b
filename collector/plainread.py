"""The plain reader: every file of every process, every pass, nothing remembered.

A process is read whole or not at all: its `stat` (the start time, and the instant of
the reading taken right after it), its `cgroup`, then for every thread listed under
`task/` that thread's `stat` (its start time), `schedstat`, `status` and `io`. A process
that vanishes mid-read is counted as vanished; one that cannot be read (permission,
malformed text) as unreadable; a thread that exits mid-read is not seen. None of it
stops the pass.

This is the definition of a reading. The collector runs the incremental reader
(collector/reading.py), which reads less on the evidence of the last pass; its readings
must equal these (tests/unit/test_incremental.py, tests/unit/test_quiet_cgroups.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

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
from collector.readings import Clock, Footprint, PassReadings, Unreadable, boottime_ns

log = logging.getLogger(__name__)


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


class PlainReader:
    """Reads every process of a `ProcFS` in full, stamping each reading with `clock()`."""

    def __init__(self, procfs: ProcFS, clock: Clock = boottime_ns, page_size: int | None = None):
        self.procfs = procfs
        self.clock = clock
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")

    def read_pass(self, quiet: Callable[[bytes], bool] | None = None) -> PassReadings:
        """Every process listed now, each read whole or counted as not read (`quiet` is
        accepted, as the engine passes it, and ignored: this reader reads everything).
        Its own loop, not the incremental reader's (`collect`): the oracle shares no code
        with what it checks."""
        listed_at = self.clock()
        read: list[ProcessReading] = []
        seen: list[Footprint] = []
        gone: list[int] = []
        refused: list[Unreadable] = []
        for pid, _inode in self.procfs.processes():
            try:
                reading = self.read_process(pid)
            except ProcessGone:
                gone.append(pid)
            except Unreadable as error:
                refused.append(error)
                if error.footprint is not None:
                    seen.append(error.footprint)
            else:
                read.append(reading)
                seen.append(Footprint(pid, reading.cgroup, len(reading.threads), reading.rss_bytes))
        denied = sum(isinstance(error.cause, AccessDenied) for error in refused)
        return PassReadings(
            listed_at_ns=listed_at,
            processes=tuple(read),
            footprints=tuple(seen),
            vanished=len(gone),
            unreadable=len(refused),
            denied=denied,
            read_until_ns=self.clock(),
        )

    def read_process(self, pid: int) -> ProcessReading:
        return read_process(self.procfs, pid, self.clock, self.page_size)

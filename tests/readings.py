"""Readings for tests, made one way: keyword-only, every field named, each left out at rest.
A field added to `ThreadReading` or `ProcessReading` is added here once, and no test's call
shifts by a position (docs/development.md)."""

from __future__ import annotations

from collections.abc import Iterable

from collector.model import ProcessReading, ThreadReading

THREAD_COUNTERS = ThreadReading._fields[2:]
"""A thread's counters, in the reading's order: what a test may draw as a sequence."""


def thread_reading(
    *,
    tid: int,
    start_ticks: int = 1,
    on_cpu_ns: int = 0,
    run_delay_ns: int = 0,
    timeslices: int = 0,
    voluntary_switches: int = 0,
    nonvoluntary_switches: int = 0,
    read_bytes: int = 0,
    write_bytes: int = 0,
) -> ThreadReading:
    return ThreadReading(
        tid=tid,
        start_ticks=start_ticks,
        on_cpu_ns=on_cpu_ns,
        run_delay_ns=run_delay_ns,
        timeslices=timeslices,
        voluntary_switches=voluntary_switches,
        nonvoluntary_switches=nonvoluntary_switches,
        read_bytes=read_bytes,
        write_bytes=write_bytes,
    )


def process_reading(
    *,
    pid: int,
    start_ticks: int = 1,
    at_ns: int = 0,
    comm: str = "p",
    utime_ticks: int = 0,
    stime_ticks: int = 0,
    major_faults: int = 0,
    rss_bytes: int = 0,
    cgroup: bytes = b"0::/\n",
    threads: Iterable[ThreadReading] | None = None,
) -> ProcessReading:
    """A process read at `at_ns`; its threads, by default its leader alone (at rest)."""
    if threads is None:
        threads = (thread_reading(tid=pid, start_ticks=start_ticks),)
    return ProcessReading(
        pid=pid,
        comm=comm,
        start_ticks=start_ticks,
        at_ns=at_ns,
        utime_ticks=utime_ticks,
        stime_ticks=stime_ticks,
        major_faults=major_faults,
        rss_bytes=rss_bytes,
        cgroup=cgroup,
        threads=tuple(threads),
    )

"""`--threads`: a group's threads read here, from the proc filesystem, each guarded like
the collector's (docs/reference.md §2), and the check that served PIDs are this node's."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from collector.model import Malformed, ProcError
from collector.parse import parse_schedstat, parse_stat, parse_status_switches
from collector.procfs import ProcFS
from collector.readings import boottime_ns
from collector.top.errors import TopError

# --- threads ---------------------------------------------------------------------------


THREAD_FIELDS: tuple[str, ...] = (
    "on_cpu_nanos",
    "run_delay_nanos",
    "voluntary_switches",
    "nonvoluntary_switches",
)
"""A thread's counters in the view, in the names of docs/reference.md §3."""


class ThreadRow(NamedTuple):
    """One thread's delta over the interval between two readings of its counters."""

    pid: int
    tid: int
    comm: str
    on_cpu_nanos: int
    run_delay_nanos: int
    voluntary_switches: int
    nonvoluntary_switches: int

    def as_dict(self) -> dict[str, object]:
        return self._asdict()


class _ThreadLast(NamedTuple):
    """A thread's last reading: its process, start time and counters."""

    pid: int
    start_ticks: int
    counters: tuple[int, int, int, int]  # in the order of THREAD_FIELDS


class ThreadWatch:
    """The threads of a set of processes, read on demand from `task/<tid>/` (`stat`:
    its name and start time; `schedstat`: on-CPU and run delay; `status`: context
    switches), each guarded by (tid, process, start time) like the collector's cache:
    no delta on first sight, when the TID now names another thread, or when a counter
    fell. A thread or process gone meanwhile is simply not seen."""

    def __init__(self, procfs: ProcFS, clock: Callable[[], int] = boottime_ns):
        self.procfs = procfs
        self.clock = clock
        self._seen: dict[int, _ThreadLast] = {}
        self._at_ns: int | None = None
        self.interval_ns: int | None = None  # between the last two readings

    def read(self, pids: Iterable[int]) -> list[ThreadRow]:
        """Read every thread of `pids` now; the deltas of those read the last time too."""
        now = self.clock()
        seen: dict[int, _ThreadLast] = {}
        rows: list[ThreadRow] = []
        for pid in pids:
            try:
                tids = self.procfs.threads(pid)
            except ProcError:
                continue
            task = self.procfs.task_dir(pid)
            for tid, _inode in tids:
                try:
                    stat = parse_stat(self.procfs.read(b"%s%d/stat" % (task, tid)))
                    sched = parse_schedstat(self.procfs.read(b"%s%d/schedstat" % (task, tid)))
                    switches = parse_status_switches(self.procfs.read(b"%s%d/status" % (task, tid)))
                except (ProcError, Malformed):
                    continue
                counters = (
                    sched.on_cpu_ns,
                    sched.run_delay_ns,
                    switches.voluntary,
                    switches.nonvoluntary,
                )
                seen[tid] = reading = _ThreadLast(pid, stat.start_ticks, counters)
                before = self._seen.get(tid)
                if (
                    before is None
                    or before.pid != pid
                    or before.start_ticks != reading.start_ticks
                    or any(n < b for n, b in zip(counters, before.counters, strict=True))
                ):
                    continue
                deltas = (n - b for n, b in zip(counters, before.counters, strict=True))
                rows.append(ThreadRow(pid, tid, stat.comm, *deltas))
        self._seen = seen
        self.interval_ns = None if self._at_ns is None else now - self._at_ns
        self._at_ns = now
        return rows


def local_comm(procfs: ProcFS, pid: int) -> str | None:
    """The name the proc filesystem gives `pid` now; None where it has no such process."""
    try:
        return parse_stat(procfs.process_file(pid, "stat")).comm
    except (ProcError, Malformed):
        return None


def check_same_node(procfs: ProcFS, served: Mapping[int, str], source: str) -> list[int]:
    """The served PIDs whose process here has the served name: those whose threads can be
    read here. TopError where the names disagree (more PIDs named otherwise than alike,
    or none alike): `top` is not on the served node, or not with the host's /proc."""
    alike, other = [], 0
    for pid, comm in served.items():
        here = local_comm(procfs, pid)
        if here == comm:
            alike.append(pid)
        elif here is not None:
            other += 1
    if served and (other > len(alike) or not alike):
        raise TopError(
            f"--threads: the PIDs {source} serves are not this node's processes under "
            f"{procfs.root} ({len(alike)} of {len(served)} with the same name here); run top "
            "on that node with the host's /proc (in procdelta's pod: PROCDELTA_PATH_PROCFS)"
        )
    return alike

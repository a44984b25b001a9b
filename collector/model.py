"""Typed readings, the interval fields, and the error types shared by every layer.

Readings are NamedTuples: immutable like frozen dataclasses, and built in a quarter of
the time (a frozen dataclass sets each field through `object.__setattr__`), which
counts when a pass builds several per thread.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

NANOS_PER_SECOND = 1_000_000_000

build = tuple.__new__
"""`build(Stat, (a, b, ...))`: a NamedTuple built without its Python-level `__new__`, the
same object at a fraction of the cost, on paths run per thread per pass. The values go
by position: tests/unit/test_model.py pins the field order of every NamedTuple built this way
(or unpacked by position), so that reordering a field fails a test instead of swapping
two integers."""


def ticks_to_ns(ticks: int, hz: int) -> int:
    """The one conversion from clock ticks (USER_HZ, `getconf CLK_TCK`) to nanoseconds."""
    return ticks * NANOS_PER_SECOND // hz


class ProcError(Exception):
    """Base of the errors the reading layer raises."""


class ProcessGone(ProcError):
    """The process or thread exited while it was being read: an ordinary event."""


class AccessDenied(ProcError):
    """The kernel refused a read (EACCES/EPERM), e.g. `io` without ptrace rights."""


class Malformed(ProcError):
    """A file's text did not parse; carries what was being parsed and the offending text."""

    def __init__(self, what: str, text: bytes | str):
        shown = text[:200] if isinstance(text, str) else text[:200].decode("utf-8", "replace")
        super().__init__(f"malformed {what}: {shown!r}")
        self.what = what
        self.text = text


class Stat(NamedTuple):
    """The fields of `/proc/<pid>/stat` that procdelta uses."""

    pid: int
    comm: str
    state: str
    num_threads: int
    start_ticks: int
    utime_ticks: int
    stime_ticks: int
    major_faults: int
    rss_pages: int


class SchedStat(NamedTuple):
    """`/proc/<pid>/task/<tid>/schedstat`: on-CPU ns, run-queue wait ns, timeslices."""

    on_cpu_ns: int
    run_delay_ns: int
    timeslices: int


class Switches(NamedTuple):
    """The context-switch lines of `status`."""

    voluntary: int
    nonvoluntary: int


class IOBytes(NamedTuple):
    """The storage lines of `io` (`read_bytes`, `write_bytes`; never `rchar`/`wchar`)."""

    read_bytes: int
    write_bytes: int


class CgroupLine(NamedTuple):
    """One line of `/proc/<pid>/cgroup`: `hierarchy-ID:controller-list:path`."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


class ThreadReading(NamedTuple):
    """One thread's counters, all monotonic over the thread's life."""

    tid: int
    start_ticks: int
    on_cpu_ns: int
    run_delay_ns: int
    timeslices: int
    voluntary_switches: int
    nonvoluntary_switches: int
    read_bytes: int
    write_bytes: int


class ProcessReading(NamedTuple):
    """One process read whole: `stat` at instant `at_ns` (CLOCK_BOOTTIME), its cgroup, threads."""

    pid: int
    comm: str
    start_ticks: int
    at_ns: int
    utime_ticks: int
    stime_ticks: int
    major_faults: int
    rss_bytes: int
    cgroup: bytes
    threads: tuple[ThreadReading, ...]


@dataclass(slots=True)
class Fields:
    """The interval payload (docs/reference.md §3): sums, never ratios. Also one process's delta."""

    processes: int = 0
    observed_nanos: int = 0
    on_cpu_nanos: int = 0
    run_delay_nanos: int = 0
    cpu_user_nanos: int = 0
    cpu_system_nanos: int = 0
    major_faults: int = 0
    voluntary_switches: int = 0
    nonvoluntary_switches: int = 0
    read_bytes: int = 0
    write_bytes: int = 0

    def add(self, other: Fields) -> None:
        self.processes += other.processes
        self.observed_nanos += other.observed_nanos
        self.on_cpu_nanos += other.on_cpu_nanos
        self.run_delay_nanos += other.run_delay_nanos
        self.cpu_user_nanos += other.cpu_user_nanos
        self.cpu_system_nanos += other.cpu_system_nanos
        self.major_faults += other.major_faults
        self.voluntary_switches += other.voluntary_switches
        self.nonvoluntary_switches += other.nonvoluntary_switches
        self.read_bytes += other.read_bytes
        self.write_bytes += other.write_bytes

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELD_NAMES}


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Fields))
"""The fields of docs/reference.md §3, in order."""

COUNTER_FIELD_NAMES: tuple[str, ...] = FIELD_NAMES[1:]
"""Every field but `processes`: the ones accumulated as `_total` counters."""

WHOLE_READ_PASSES = 64
"""K, the bound of every shortcut that reads less: each process, with all its threads
(collector/reading.py), and each group's cgroup directory, with all its files
(collector/cgroupfs.py), is read whole at least once every this many passes, staggered
so that each pass reads about 1/K of them whole. A whole read costs several times a
shortcut's read of an idle process, so the bound costs about that over K: on the bench's
tables (docs/bench.md, the `unbound` rows) +0.08 of the floor at K = 16, +0.02-0.04 at 64.
At the default `--interval 15`, 64 passes are 16 minutes."""


def whole_read_due(key: int, passes: int, every: int | None = WHOLE_READ_PASSES) -> bool:
    """Whether this pass reads whole the process (by PID) or the cgroup (by the inode of
    its directory) `key`: once every `every` passes, staggered by the key; never where
    `every` is None (no bound: only the bench, to weigh what the bound costs)."""
    return every is not None and not (key + passes) % every


REFUSAL_REASONS: tuple[str, ...] = (
    "first_seen",
    "pid_reused",
    "counter_fell",
    "unreadable",
    "vanished",
    "unplaced",
)
"""Why a process contributed no delta in a pass (`procdelta_dropped_deltas_total{reason}`).
`vanished` and `unplaced` (read whole, but its cgroup path could not be placed on the host:
docs/reference.md §4) count processes whatever their guard said."""

THREAD_REFUSAL_REASONS: tuple[str, ...] = REFUSAL_REASONS[:3]
"""Why a thread of a contributing process added nothing to its sums in a pass
(`procdelta_dropped_thread_deltas_total{reason}`): guarded like a process (docs/reference.md §2)."""


class Pressure(NamedTuple):
    """A PSI file (`cpu.pressure`, `memory.pressure`, `io.pressure`): the `total=` of its
    `some` and `full` lines, in microseconds (Documentation/accounting/psi.rst)."""

    some_us: int
    full_us: int | None  # None where the kernel prints no `full` line


class Bandwidth(NamedTuple):
    """The CFS bandwidth counters of one cgroup (`cpu.stat`), with the directory they
    were read from: `path` relative to the group's own cgroup (`b""` for itself); and its
    quota per period (`cpu.max`, v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`), read only
    where a period was throttled since the last reading (collector/waits.py,
    `throttled_wall_ns`), else carried; None where it has none or it was not read."""

    path: bytes
    inode: int
    periods: int
    throttled_periods: int
    throttled_ns: int
    quota_ns: int | None = None
    period_ns: int | None = None


class CgroupReading(NamedTuple):
    """One group's own cgroup, read once in a pass (docs/reference.md §7).

    `identity` is (hierarchy, inode) of each of the group's directories that was read: a
    cgroup removed and made again under the same path has a new inode. `usage_ns` and
    `pressure` (cpu, memory, io) are hierarchical in the kernel and read from the group's
    own directory; `bandwidth` is not, so it lists the group's cgroup and every cgroup
    below it. None: the node has no such file for this group.
    """

    identity: tuple[tuple[str, int], ...]
    usage_ns: int | None
    pressure: tuple[Pressure | None, Pressure | None, Pressure | None]
    bandwidth: tuple[Bandwidth, ...] | None


@dataclass(frozen=True, slots=True)
class CgroupFields:
    """The fields of docs/reference.md §7 for one group and one interval; None = no
    source on the node."""

    cgroup_cpu_nanos: int | None = None
    cpu_periods: int | None = None
    cpu_throttled_periods: int | None = None
    cpu_throttled_nanos: int | None = None
    cpu_pressure_waiting_nanos: int | None = None
    cpu_pressure_stalled_nanos: int | None = None
    memory_pressure_waiting_nanos: int | None = None
    memory_pressure_stalled_nanos: int | None = None
    io_pressure_waiting_nanos: int | None = None
    io_pressure_stalled_nanos: int | None = None
    # why the group waited (collector/waits.py), on one of two bases. Where its cgroup has
    # CPU pressure with a `full` line: wall time, from the kernel's moment-by-moment
    # account (the `full` stall split into its own quota's part and its neighbours', and
    # `some` beyond `full`: waits while another of its own tasks ran) ...
    cpu_stalled_throttled_nanos: int | None = None
    cpu_stalled_neighbours_nanos: int | None = None
    cpu_waiting_own_threads_nanos: int | None = None
    # ... elsewhere: its run delay (thread-time) split on the interval's averages, from the
    # process sums, the throttled time above and the node's CPU time of the interval
    run_delay_throttled_nanos: int | None = None
    run_delay_own_threads_nanos: int | None = None
    run_delay_neighbours_nanos: int | None = None
    # ... and what they are parts of: the thread-time it was runnable (on-CPU + run
    # delay) in those passes, so that a consumer's share never reads a pass on the
    # other basis, nor counters a group has whatever its basis
    run_delay_runnable_nanos: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in CGROUP_FIELD_NAMES}


CGROUP_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(CgroupFields))
"""The seventeen fields of docs/reference.md §7, in order (the last seven: why the group
waited, on either basis); each is both an interval gauge and a counter."""

CGROUP_REFUSAL_REASONS: tuple[str, ...] = ("first_seen", "recreated", "counter_fell")
"""Why a group's cgroup gave no delta in a pass (`procdelta_dropped_cgroup_deltas_total`):
its first sighting, a directory made anew under the same path, or a counter that fell."""


class CpuSet(NamedTuple):
    """The CPUs a group's running processes may use (collector/cpusets.py), as the page
    says them: the kernel's list (`0-3,8`), or `all` where it is every CPU a cgroup may
    have; and how many."""

    cpus: str
    # (a NamedTuple field may hide tuple's method `count`, which nothing calls on a
    # CpuSet; mypy takes the field for a wrong override of the method)
    count: int  # type: ignore[assignment]


EXIT_REFUSAL_REASONS = ("not_kernel", "not_taskstats", "malformed")
"""Why a datagram on the exit records' socket is refused (`ExitListener.refused`): it was
not sent by the kernel (its sender's port id is not 0: another process with CAP_NET_ADMIN
may send to the listener's port), it is no message of the TASKSTATS family, or it is not a
well-formed exit record."""

EXIT_OUTCOMES = ("closed", "born", "read", "counter_fell", "unmatched", "late", "unplaced")
"""What an exit record came to: it closed the last interval of a task the cache held;
counted whole a task born since the previous pass began listing; found the task read at or
after its exit (a zombie: nothing left to close); was refused, a counter below the cached
one; matched no task the cache held and none born since (a task older than the collector's
last pass, never read: its last interval stays lost); may have waited in the socket longer
than a start can be matched across (`START_TOLERANCE_NS`: closes nothing); or, closed or
born, had no group a file could tell (its parent gone too): added to the node's own sums
(the last is the engine's, `Engine._close_exits`)."""

"""The cgroup filesystem (docs/reference.md §7): `detect` finds the hierarchies under
`--path.cgroupfs` by what they hold (the host's `/sys/fs/cgroup`, mounted read-only in a
container, or a fixture tree of plain files), and `CgroupFS` reads each group's own
counters into a `CgroupReading`. Where the pods' cgroups are is
collector/podcgroups.py's; parsing is collector/parse.py's.

Which hierarchy a field comes from is decided per group: v2 first, then the v1
controllers, each field from the first hierarchy where the group's own directory has it.
On a hybrid host (v1 controllers beside a v2 tree with none) the v2 `cpu.stat` still
counts usage and the `*.pressure` files exist, while the bandwidth counters are the v1
`cpu` controller's.

A missing file is no source for that field, never an error; a cgroup removed while it is
read is an ordinary event (it is simply not read this pass).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from collector.groups import HIERARCHY_ORDER
from collector.model import (
    WHOLE_READ_PASSES,
    Bandwidth,
    CgroupReading,
    Malformed,
    Pressure,
    build,
    whole_read_due,
)
from collector.parse import (
    parse_cfs_quota,
    parse_cpu_max,
    parse_flat_keyed,
    parse_pressure,
    parse_single_value,
)

log = logging.getLogger(__name__)

V2, CPU, CPUACCT = HIERARCHY_ORDER

_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.EOPNOTSUPP, errno.EINVAL})
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # a group, as the caller keys them
_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
HELD_DIRECTORIES = 512
"""At most this many group directories are held open (`CgroupFS._held_dir`): far below
the 1024 descriptors a container runtime allows by default."""
_PSI_FILES = (b"cpu.pressure", b"memory.pressure", b"io.pressure")
_PSI = tuple[Pressure | None, Pressure | None, Pressure | None]
_NO_PSI: _PSI = (None, None, None)


@functools.lru_cache(maxsize=1024)
def _cpu_stat(data: bytes) -> Mapping[bytes, int]:
    """A `cpu.stat`, parsed once for the same bytes: an idle group's file reads the same
    pass after pass (read-only, as it is shared)."""
    return MappingProxyType(parse_flat_keyed(data))


_psi_totals = functools.lru_cache(maxsize=1024)(parse_pressure)  # the same, for PSI files


@functools.lru_cache(maxsize=1024)
def _v2_cpu_stat(data: bytes) -> tuple[Mapping[bytes, int], int | None, bool]:
    """A v2 `cpu.stat` (`_cpu_stat`), with what a group's reading takes from it: its
    usage in ns, and whether it has the bandwidth counters (the group's cpu controller
    is on)."""
    stat = _cpu_stat(data)
    usage = stat.get(b"usage_usec")
    return stat, None if usage is None else usage * 1000, b"nr_periods" in stat


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """The hierarchies found under the cgroupfs root (absolute paths, as bytes), and
    whether the v2 tree has pressure (PSI) files."""

    v2: bytes | None = None
    cpu: bytes | None = None
    cpuacct: bytes | None = None
    psi: bool = False
    cpuset: bytes | None = None  # v1's cpuset hierarchy (collector/cpusets.py)

    def root(self, hierarchy: str) -> bytes | None:
        return getattr(self, hierarchy)

    def found(self) -> list[str]:
        return [h for h in HIERARCHY_ORDER if self.root(h) is not None]


def detect(root: str) -> Hierarchies:
    """The hierarchies under `root`, judged by their files (cAdvisor and runc tell v1 from
    v2 the same way): v2 has `cgroup.controllers` at its root, alone (pure v2) or as
    `unified/` beside v1 controllers (hybrid); a v1 controller is a directory of its own,
    or one shared with another controller (`cpu,cpuacct`, usually with symlinks)."""
    base = os.fsencode(root.rstrip("/") or "/")

    def has(directory: bytes, name: bytes) -> bool:
        return os.path.isfile(os.path.join(directory, name))

    v2 = None
    for candidate in (base, os.path.join(base, b"unified")):
        if has(candidate, b"cgroup.controllers"):
            v2 = candidate
            break
    if v2 == base:  # pure v2: no v1 hierarchy beside it
        return Hierarchies(v2=v2, psi=_readable(os.path.join(v2, b"cpu.pressure")))

    def controller(file: bytes, names: tuple[bytes, ...]) -> bytes | None:
        for name in names:
            candidate = os.path.join(base, name)
            if has(candidate, file):
                return candidate
        return None

    return Hierarchies(
        v2=v2,
        cpu=controller(b"cpu.stat", (b"cpu", b"cpu,cpuacct", b"cpuacct,cpu")),
        cpuacct=controller(b"cpuacct.usage", (b"cpuacct", b"cpu,cpuacct", b"cpuacct,cpu")),
        psi=v2 is not None and _readable(os.path.join(v2, b"cpu.pressure")),
        cpuset=controller(b"cpuset.effective_cpus", (b"cpuset",)),
    )


def _readable(path: bytes) -> bool:
    """A PSI file that opens and reads: with `psi=0` the kernel hides it or refuses it."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return False
    try:
        return bool(os.read(fd, 4096))
    except OSError:
        return False
    finally:
        os.close(fd)


class Location(NamedTuple):
    """One of a group's directories: its hierarchy, its path from the hierarchy's root,
    its inode (None until it is looked up), and whether its bandwidth counters are summed
    over the cgroups below it (a pod's or a container's: docs/reference.md §7)."""

    hierarchy: str
    path: bytes
    inode: int | None
    subtree: bool


class _Dir(NamedTuple):
    """One of a group's directories, resolved from its `Location`: its hierarchy's root,
    the location, the directory's whole path, its inode, the group's identity entry
    for it, and (v2 only, whose parent's PSI files `_pressure` reads) its parent
    directory, None at the hierarchy's root."""

    root: bytes
    location: Location
    directory: bytes
    inode: int
    ident: tuple[str, int]
    parent: bytes | None


class _Plan(NamedTuple):
    """What reading a group takes, resolved once from its `Location`s (`CgroupFS._plan`):
    kept from pass to pass while the group's locations are equal to `locations` (each
    hierarchy, path and inode), made anew when any differs. `listed`: every inode is the
    listing's (else one was looked up for this pass alone, and the plan is not kept).
    `stagger` is the inode of its first directory (`whole_read_due`); `identities`, the
    group's identity by which of its directories were read (bit 1 v2, 2 cpuacct, 4 cpu)."""

    locations: Sequence[Location]
    listed: bool
    stagger: int
    v2: _Dir | None
    cpuacct: _Dir | None
    cpu: _Dir | None
    identities: tuple[tuple[tuple[str, int], ...], ...]


class _Held(NamedTuple):
    """A group directory held open between passes (`CgroupFS._held_dir`): the inode it
    was opened at, and its `O_PATH` descriptor."""

    inode: int
    fd: int


class CgroupFS:
    """Reads groups' cgroup counters in the hierarchies under `root`, found once, at
    construction (a node's cgroup mounts are made at boot; a collector started before
    them is restarted by its liveness probe or by hand, and says at start-up what it
    found)."""

    def __init__(
        self,
        root: str = "/sys/fs/cgroup",
        pressure: bool = True,
        whole_read_passes: int | None = WHOLE_READ_PASSES,
        cpu_pressure_only: bool = False,
    ):
        self.root = root
        self.pressure = pressure
        self.cpu_pressure_only = cpu_pressure_only  # memory and I/O pressure left unread
        # K (collector/model.py); None only where a test looks at one shortcut alone
        self.whole_read_passes = whole_read_passes
        self.hierarchies = detect(root)
        self._held: dict[bytes, _Held] = {}  # by directory
        self._held_used: set[bytes] = set()
        # The PSI totals of the groups' parent directories: read at the first group of
        # each in a pass (this pass's), and as the last pass left them (`_stalled_below`).
        self._parents: dict[bytes, tuple[Pressure | None, ...]] = {}  # 3 each, as `_PSI`
        self._parents_before: dict[bytes, tuple[Pressure | None, ...]] = {}
        self._stalled: dict[bytes, tuple[bool, ...]] = {}  # by parent, this pass: 3 each
        self._passes = 1  # this pass's number (`release_unused` ends one)
        # the groups' plans (`read_groups`), and how many groups this pass read
        self._plans: dict[Hashable, _Plan] = {}
        self._groups_read = 0

    def read_groups(
        self,
        targets: Mapping[K, Sequence[Location]],
        previous: Mapping[K, CgroupReading],
    ) -> dict[K, CgroupReading]:
        """Each group's reading: its cgroup counters from its directories (`targets`),
        usage from v2 `cpu.stat`, else v1 `cpuacct.usage`; pressure from v2; bandwidth
        from v2 `cpu.stat` where its cpu controller is on, else v1 `cpu`. A group none
        of whose directories could be read (the cgroup is gone) has none.
        `release_unused` ends the pass.

        With the group's `previous` reading, the bandwidth counters are carried over
        unread when the usage did not move (`_bandwidth_unchanged`), and a PSI file's
        totals when its parent's did not move (`pressure_unmoved`) — but for one pass in
        `WHOLE_READ_PASSES` (staggered by the inode of the group's first directory), which
        reads every file: whatever those facts miss is read then, never lost.

        A group's plan (`_plan`) is kept from pass to pass while its `Location`s are the
        same (every path and inode, as listed), and made anew from them otherwise."""
        readings: dict[K, CgroupReading] = {}
        plans = self._plans
        psi = self.pressure and self.hierarchies.psi
        self._groups_read += len(targets)
        for group, locations in targets.items():
            plan = plans.get(group)
            if plan is None or plan.locations != locations:
                plan = self._plan(locations)
                if plan is None:
                    continue
                if plan.listed:
                    plans[group] = plan
            reading = self._read_plan(plan, previous.get(group), psi)
            if reading is not None:
                readings[group] = reading
        return readings

    def _plan(self, locations: Sequence[Location]) -> _Plan | None:
        """Where a group's files are: the first of its locations in each hierarchy found
        on the node, with its directory's inode (looked up where the location has none);
        None if it has none (or they are gone)."""
        dirs: dict[str, _Dir] = {}
        listed = True
        for location in locations:
            root = self.hierarchies.root(location.hierarchy)
            if root is None or location.hierarchy in dirs:
                continue
            directory = root + location.path
            inode = location.inode
            if inode is None:
                listed = False  # looked up now: the plan is this pass's only
                try:
                    inode = os.stat(directory).st_ino
                except OSError:
                    continue  # gone
            at_root = location.hierarchy != V2 or directory == self.hierarchies.v2
            parent = None if at_root else os.path.dirname(directory)
            ident = (location.hierarchy, inode)
            dirs[location.hierarchy] = _Dir(root, location, directory, inode, ident, parent)
        if not dirs:
            return None
        v2, cpuacct, cpu = dirs.get(V2), dirs.get(CPUACCT), dirs.get(CPU)
        identities = tuple(
            tuple(
                d.ident
                for bit, d in ((1, v2), (2, cpuacct), (4, cpu))
                if read & bit and d is not None
            )
            for read in range(8)
        )
        first = next(iter(dirs.values())).inode
        return _Plan(locations[:], listed, first, v2, cpuacct, cpu, identities)

    def _read_plan(
        self, plan: _Plan, previous: CgroupReading | None, psi: bool
    ) -> CgroupReading | None:
        """One group's reading (`read_groups`), by its plan."""
        _, _, stagger, v2, cpuacct, cpu, identities = plan
        if whole_read_due(stagger, self._passes, self.whole_read_passes):
            previous = None  # read whole: nothing carried over
        read = 0  # which directories were read: 1 v2, 2 cpuacct, 4 cpu (`_Plan`)
        usage: int | None = None
        pressure: _PSI = _NO_PSI
        v2_stat: Mapping[bytes, int] | None = None
        v2_periods = False
        at: int | None  # the directory's descriptor (`_held_dir`), None: opened by path
        if v2 is not None:
            held = self._held.get(v2.directory)  # `_held_dir`, inline: held since a pass before
            if held is not None and held.inode == v2.inode:
                self._held_used.add(v2.directory)
                at = held.fd
            else:
                at = self._held_dir(v2.directory, v2.inode)
            parsed = _parsed(
                b"cpu.stat" if at is not None else v2.directory + b"/cpu.stat", _v2_cpu_stat, at
            )
            if parsed is not None:
                read = 1
                v2_stat, usage, v2_periods = parsed
                if psi:
                    pressure = self._pressure(v2, at, previous)
        if usage is None and cpuacct is not None:
            at = self._held_dir(cpuacct.directory, cpuacct.inode)
            name = b"cpuacct.usage" if at is not None else cpuacct.directory + b"/cpuacct.usage"
            usage = _parsed(name, parse_single_value, at)
            if usage is not None:
                read |= 2
        source = v2 if v2_periods else None
        if source is None and cpu is not None:
            source = cpu
            read |= 4
        if not read:
            return None
        identity = identities[read]
        bandwidth: tuple[Bandwidth, ...] | None = None
        if source is None:
            pass
        elif previous is not None and _bandwidth_unchanged(identity, usage, previous):
            bandwidth = previous.bandwidth
        else:
            # (`source` is v2, or else `cpu`, the v1 cpu directory)
            stat = v2_stat if source is v2 else _parsed(source.directory + b"/cpu.stat", _cpu_stat)
            if stat is not None:
                before = None if previous is None else previous.bandwidth
                bandwidth = self._bandwidth(
                    source.root, source.location, source.inode, stat, before, source is v2
                )
        return build(CgroupReading, (identity, usage, pressure, bandwidth))

    def _held_dir(self, directory: bytes, inode: int) -> int | None:
        """An `O_PATH` descriptor of a group's directory, kept between passes, so that its
        files are opened by name (`openat`) instead of by a walk of their whole path:
        about a third of the cost of reading a small cgroup file.

        Held by (path, inode): a cgroup made anew under the same path is opened anew. An
        `O_PATH` descriptor holds no file buffer (the team keeps no proc or cgroup
        *file* open: each would pin a page of kernel memory), and does not keep a cgroup
        from being removed; it is closed at the end of the first pass that does not read
        its directory. At most `HELD_DIRECTORIES` are held; past that, paths are walked.
        """
        held = self._held.get(directory)
        if held is not None:
            if held.inode == inode:
                self._held_used.add(directory)
                return held.fd
            os.close(held.fd)
            del self._held[directory]
        if len(self._held) >= HELD_DIRECTORIES:
            return None
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except OSError:
            return None
        try:
            same = os.fstat(fd).st_ino == inode
        except OSError:
            same = False
        if not same:  # made anew since it was listed: read by path this pass
            os.close(fd)
            return None
        self._held[directory] = _Held(inode, fd)
        self._held_used.add(directory)
        return fd

    def release_unused(self) -> None:
        """End of a pass: let go of the directories held and not read since the last (and
        of the groups' plans, once those of groups gone are as many as the groups read)."""
        for directory in [d for d in self._held if d not in self._held_used]:
            os.close(self._held.pop(directory).fd)
        self._held_used = set()
        self._parents_before, self._parents, self._stalled = self._parents, {}, {}
        if len(self._plans) > 2 * self._groups_read + 64:  # groups gone: their plans too
            self._plans = {}
        self._groups_read = 0
        self._passes += 1

    def _stalled_below(self, parent: bytes) -> tuple[bool, ...]:
        """For cpu, memory and io: whether a cgroup below `parent` may have stalled since
        the last pass (`pressure_unmoved`). The parent's three files are read once a pass,
        at the first group below it, so before any of its groups is read."""
        stalled = self._stalled.get(parent)
        if stalled is None:
            now = self._parents[parent] = tuple(
                _parsed(parent + b"/" + name, _psi_totals) for name in _PSI_FILES
            )
            before = self._parents_before.get(parent)
            stalled = self._stalled[parent] = (
                (True, True, True)
                if before is None
                else tuple(not pressure_unmoved(b, n) for b, n in zip(before, now, strict=True))
            )
        return stalled

    def _pressure(self, v2: _Dir, at: int | None, previous: CgroupReading | None) -> _PSI:
        """The group's three PSI files; each one carried over from its `previous` reading
        of the same cgroup where its parent's did not move since the last pass. (The
        parent is read first, whether or not this group has a previous reading: every
        reading of a group below is then later than its parent's of the same pass. A
        hierarchy's root has no parent: read.)"""
        cpu_file, memory_file, io_file = (
            _PSI_FILES if at is not None else [v2.directory + b"/" + n for n in _PSI_FILES]
        )
        parent = v2.parent
        if parent is None:
            cpu_moved = memory_moved = io_moved = True
        else:
            stalled = self._stalled.get(parent) or self._stalled_below(parent)
            cpu_moved, memory_moved, io_moved = stalled
        cpu, memory, io = (
            previous.pressure
            if previous is not None and v2.ident in previous.identity  # the same cgroup
            else _NO_PSI
        )
        cpu = _parsed(cpu_file, _psi_totals, at) if cpu_moved or cpu is None else cpu
        if self.cpu_pressure_only:
            return cpu, None, None
        return (
            cpu,
            _parsed(memory_file, _psi_totals, at) if memory_moved or memory is None else memory,
            _parsed(io_file, _psi_totals, at) if io_moved or io is None else io,
        )

    def _bandwidth(
        self,
        root: bytes,
        location: Location,
        inode: int,
        stat: Mapping[bytes, int],
        before: tuple[Bandwidth, ...] | None,
        v2: bool,
    ) -> tuple[Bandwidth, ...] | None:
        """The bandwidth counters of the group's cgroup and, for a pod, of every cgroup
        below it: the kernel keeps them per cgroup, for that cgroup's own quota. Each with
        its quota (`_with_quota`), given the group's last reading (`before`)."""
        last = {} if before is None else {entry.path: entry for entry in before}
        own = _bandwidth_of(b"", inode, stat)
        if own is None:
            return None
        directory = root + location.path
        found = [_with_quota(own, directory, last.get(b""), v2)]
        if location.subtree:
            stack = [(b"", directory)]
            while stack:
                relative, directory = stack.pop()
                for child, child_inode in subdirs(directory):
                    path = relative + b"/" + child
                    below = directory + b"/" + child
                    child_stat = _parsed(below + b"/cpu.stat", _cpu_stat)
                    counters = (
                        None if child_stat is None else _bandwidth_of(path, child_inode, child_stat)
                    )
                    if counters is not None:
                        found.append(_with_quota(counters, below, last.get(path), v2))
                    stack.append((path, below))
        return tuple(found)


def usage_hierarchy(reading: CgroupReading) -> str:
    """The hierarchy a reading's usage came from: v1 `cpuacct` where it was read (only
    where the v2 `cpu.stat` had none), else v2 (`read_groups`)."""
    return CPUACCT if any(h == CPUACCT for h, _ in reading.identity) else V2


def _bandwidth_unchanged(
    identity: tuple[tuple[str, int], ...], usage_ns: int | None, previous: CgroupReading
) -> bool:
    """Whether a group's bandwidth counters cannot have moved since its previous reading:
    the same cgroup, whose CPU usage did not move.

    Usage is charged whenever any task of the cgroup runs, and a task its quota throttles
    is runnable: the next period unthrottles it and it runs. So a cgroup whose usage stood
    still was not throttled meanwhile. The kernel's period timer may still count one or
    two idle periods (`nr_periods`) after the last run, and v2 usage is in µs; such
    counts are read at the next pass whose usage moved: deferred, never lost (the
    counters are cumulative, and the guard compares with the last reading it was given).
    """
    return (
        usage_ns is not None
        and usage_ns == previous.usage_ns
        and identity == previous.identity
        and previous.bandwidth is not None
    )


def pressure_unmoved(before: Pressure | None, now: Pressure | None) -> bool:
    """Whether no cgroup below a directory stalled on a resource between two readings of
    the directory's PSI file for it: both read, and equal.

    Kernel fact: PSI is kept for every cgroup on the path from a task's cgroup to the
    root (`psi_task_change` walks up the parents), and a group's stall states come from
    task counts summed over its whole subtree: whenever a task below stalls (waits for a
    CPU, for memory, for I/O), every ancestor is in that resource's `some` state too,
    and its total grows. A still total above means still totals below, so the children's
    last readings stand. (The kernel weights each CPU's stall time by that CPU's busy
    time when it adds to a total, and truncates to whole ns: a stall of a few ns can
    move a child and not its parent; at worst the child's count, printed in µs, is read
    one µs late, when the parent next moves — deferred, never lost. A parent whose
    PSI was turned off through `cgroup.pressure` has no files: not read, no shortcut.)
    """
    return before is not None and before == now


def _bandwidth_of(path: bytes, inode: int, stat: Mapping[bytes, int]) -> Bandwidth | None:
    """The bandwidth counters in one cgroup's parsed `cpu.stat`, v1 or v2; None without."""
    periods = stat.get(b"nr_periods")
    throttled = stat.get(b"nr_throttled")
    if periods is None or throttled is None:
        return None
    if b"throttled_usec" in stat:  # v2
        throttled_ns = stat[b"throttled_usec"] * 1000
    elif b"throttled_time" in stat:  # v1, already ns
        throttled_ns = stat[b"throttled_time"]
    else:
        return None
    return Bandwidth(path, inode, periods, throttled, throttled_ns)


def _with_quota(
    counters: Bandwidth, directory: bytes, last: Bandwidth | None, v2: bool
) -> Bandwidth:
    """A cgroup's counters with its quota and period: read where it was throttled in a
    period since its `last` reading (or in any period, without one), the only intervals
    whose throttled time the quota serves to turn into wall time
    (collector/waits.py, `throttled_wall_ns`); carried from `last` elsewhere."""
    if last is not None and last.inode == counters.inode:
        if counters.throttled_periods == last.throttled_periods:
            return counters._replace(quota_ns=last.quota_ns, period_ns=last.period_ns)
    elif not counters.throttled_periods:
        return counters
    if v2:
        quota_us, period_us = _parsed(directory + b"/cpu.max", parse_cpu_max) or (None, None)
    else:
        quota_us = _parsed(directory + b"/cpu.cfs_quota_us", parse_cfs_quota)
        period_us = _parsed(directory + b"/cpu.cfs_period_us", parse_single_value)
    if quota_us is None or period_us is None:
        return counters
    return counters._replace(quota_ns=quota_us * 1000, period_ns=period_us * 1000)


def subdirs(directory: bytes) -> list[tuple[bytes, int]]:
    """(name, inode) of the directories in `directory`; none if it is gone."""
    try:
        with os.scandir(directory) as entries:
            return [(e.name, e.inode()) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _read(path: bytes, dir_fd: int | None = None) -> bytes | None:
    """A small cgroup file's bytes, or None where it does not exist (or is gone). With
    `dir_fd`, `path` is a name in that directory (`openat`: no path walk)."""
    try:
        fd = os.open(path, _FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno not in _ABSENT and error.errno not in (errno.EACCES, errno.EPERM):
            log.debug("cannot open %s: %s", path, error)
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _parsed(path: bytes, parse: Callable[[bytes], T], dir_fd: int | None = None) -> T | None:
    """A small cgroup file, parsed; None where it does not exist, is gone, or does not
    parse (said in the debug log: the field then has no series this pass)."""
    data = _read(path, dir_fd)
    if data is None:
        return None
    try:
        return parse(data)
    except Malformed as error:
        log.debug("%s: %s", path, error)
        return None

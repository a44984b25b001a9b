"""The guard of the groups' cgroup counters (docs/reference.md §7): readings in, deltas
and refusals out.

Pure, like the process guard (collector/tracker.py): no I/O, no clock. A group's cgroup
is identified by the inodes of its directories (a cgroup removed and made again under
the same path is a new one). Per group and pass:

| case | result |
| --- | --- |
| not in the cache (first sighting) | no delta (`first_seen`) |
| a directory has another inode (made anew) | no delta (`recreated`) |
| any counter below the cached one | no delta at all for the group (`counter_fell`) |
| otherwise | delta = new - cached, field by field |

The bandwidth counters are summed over the group's cgroup and the cgroups below it
(the kernel keeps them per cgroup). Each of those is guarded on its own, by its path
below the group and its inode: one seen at the last pass with the same inode adds its
difference; one that was not there at the last pass (or was there under another inode)
was made since the group's last reading, so every count it holds is this interval's
and it adds them whole; one that is gone loses its last interval, as an exited process
does. The group's own identity does not change with its children (a container restarts
inside the same pod).

In every case the new reading replaces the cached one; a group not read in a pass is
forgotten, so the cache is bounded by the cgroups on the node.

The guard forms no cause of waiting: where a group's causes can be the kernel's (its CPU
pressure has a `full` line, and its bandwidth counters are in both readings or in neither),
it gives the wall time its quotas throttled it (`CgroupAdvance.throttled_wall_ns`), and
`waits.with_waits` forms every cause, on either basis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, TypeVar, overload

from collector.model import Bandwidth, CgroupFields, CgroupReading, Pressure
from collector.waits import throttled_wall_ns

K = TypeVar("K", bound=Hashable)  # a group, as the caller keys them


@dataclass(slots=True)
class CgroupAdvance(Generic[K]):
    """The outcome of one pass through the guard."""

    deltas: dict[K, CgroupFields] = field(default_factory=dict)  # no cause formed
    refused: Counter[str] = field(default_factory=Counter)
    # of the groups with a delta whose causes are the kernel's: the wall time their quotas
    # throttled them (`throttled_wall_ns`), for `split_cpu_stall`
    throttled_wall_ns: dict[K, int] = field(default_factory=dict)


class _Fell(Exception):
    """A counter of the new reading is below the cached one."""


@overload
def _difference(new: int, old: int) -> int: ...
@overload
def _difference(new: int | None, old: int | None) -> int | None: ...
def _difference(new: int | None, old: int | None) -> int | None:
    if new is None or old is None:
        return None
    if new < old:
        raise _Fell
    return new - old


def _pressure(new: Pressure | None, old: Pressure | None) -> tuple[int | None, int | None]:
    """(waiting ns, stalled ns) of one PSI file: `some` and `full`, µs → ns."""
    if new is None or old is None:
        return None, None
    some = _difference(new.some_us, old.some_us)  # every PSI file has its `some` line
    full = _difference(new.full_us, old.full_us)
    return some * 1000, None if full is None else full * 1000


def _bandwidth(
    new: tuple[Bandwidth, ...] | None, old: tuple[Bandwidth, ...] | None
) -> tuple[int | None, int | None, int | None, int]:
    """(periods, throttled periods, throttled ns) summed over the cgroups of the group,
    and the wall time its quotas throttled it (`throttled_wall_ns`, summed likewise)."""
    if new is None or old is None:
        return None, None, None, 0
    before = {entry.path: entry for entry in old}
    periods = throttled = throttled_ns = wall_ns = 0
    for entry in new:
        last = before.get(entry.path)
        if last is None or last.inode != entry.inode:  # made since the last reading
            n, t = entry.throttled_periods, entry.throttled_ns
            periods += entry.periods
        else:
            n = _difference(entry.throttled_periods, last.throttled_periods)
            t = _difference(entry.throttled_ns, last.throttled_ns)
            periods += _difference(entry.periods, last.periods)
        throttled += n
        throttled_ns += t
        wall_ns += throttled_wall_ns(n, t, entry.quota_ns, entry.period_ns)
    return periods, throttled, throttled_ns, wall_ns


def cgroup_delta(new: CgroupReading, old: CgroupReading) -> tuple[CgroupFields, int | None] | None:
    """The fields of one interval from two readings of the same cgroup, no cause formed,
    and the wall time its quotas throttled it where its causes can be the kernel's (a CPU
    `full` line; the bandwidth counters in both readings or in neither: no quota of its
    own in this hierarchy), else None. None if a counter fell (the whole delta is
    dropped, never one field clamped)."""
    try:
        usage = _difference(new.usage_ns, old.usage_ns)
        periods, throttled, throttled_ns, throttled_wall = _bandwidth(new.bandwidth, old.bandwidth)
        cpu = _pressure(new.pressure[0], old.pressure[0])
        memory = _pressure(new.pressure[1], old.pressure[1])
        io = _pressure(new.pressure[2], old.pressure[2])
    except _Fell:
        return None
    known = cpu[1] is not None and (new.bandwidth is None) == (old.bandwidth is None)
    fields = CgroupFields(usage, periods, throttled, throttled_ns, *cpu, *memory, *io)
    return fields, throttled_wall if known else None


def _shape(reading: CgroupReading) -> tuple[bool, ...]:
    """Which fields a reading has: usage, bandwidth, each PSI file with its `full` line."""
    return (
        reading.usage_ns is not None,
        reading.bandwidth is not None,
        *(p is not None and p.full_us is not None for p in reading.pressure),
        *(p is not None for p in reading.pressure),
    )


@lru_cache(maxsize=64)
def _nothing_moved(shape: tuple[bool, ...]) -> tuple[CgroupFields, int | None]:
    """The delta of a reading equal to the cached one (most of a node's cgroups, most
    passes: nothing of theirs ran or waited), by the reading's shape: every field it has
    at 0, the others None; and its throttled wall time, 0 where its causes can be the
    kernel's (a CPU `full` line). Made once per shape (CgroupFields is immutable)."""
    usage, bandwidth, *rest = shape
    full, some = rest[:3], rest[3:]
    values: list[int | None] = [0 if usage else None] + [0 if bandwidth else None] * 3
    for has_some, has_full in zip(some, full, strict=True):
        values += [0 if has_some else None, 0 if has_full else None]
    return CgroupFields(*values), 0 if full[0] else None


class CgroupTracker(Generic[K]):
    """Keeps one `CgroupReading` per group between passes."""

    def __init__(self) -> None:
        self._cache: dict[K, CgroupReading] = {}

    def advance(self, readings: Mapping[K, CgroupReading]) -> CgroupAdvance[K]:
        outcome: CgroupAdvance[K] = CgroupAdvance()
        for group, new in readings.items():
            old = self._cache.get(group)
            if old is None:
                outcome.refused["first_seen"] += 1
                continue
            if old.identity != new.identity:
                outcome.refused["recreated"] += 1
                continue
            delta = _nothing_moved(_shape(new)) if new == old else cgroup_delta(new, old)
            if delta is None:
                outcome.refused["counter_fell"] += 1
                continue
            outcome.deltas[group], wall = delta
            if wall is not None:
                outcome.throttled_wall_ns[group] = wall
        self._cache = dict(readings)
        return outcome

    @property
    def tracked(self) -> int:
        return len(self._cache)

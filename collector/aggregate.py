"""Per-group sums: the interval of one pass, the footprint it saw, and running totals."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import Final

from collector.groups import UNPLACED, CgroupDirs, Group, Grouper
from collector.model import (
    CGROUP_FIELD_NAMES,
    COUNTER_FIELD_NAMES,
    CgroupFields,
    Fields,
    Malformed,
)
from collector.readings import Footprint
from collector.tracker import CarriedDelta, ProcessDelta


@dataclass(slots=True)
class FootprintSums:
    """What a pass saw of a group, delta or not."""

    processes: int = 0
    threads: int = 0
    rss_bytes: int = 0


@dataclass(slots=True)
class Grouped:
    intervals: dict[Group, Fields]
    footprints: dict[Group, FootprintSums]
    malformed_pids: set[int]
    cgroup_dirs: dict[Group, CgroupDirs]  # of each non-pod group seen: where its cgroup is
    unplaced: int = 0  # processes read whose group their cgroup file could not tell
    # Kept for the processes view (collector/processes.py): each process's group by PID
    # (None: left out of the sums), and each carried block's by its cgroup file (absent:
    # left out).
    group_of_pid: dict[int, Group | None] = field(default_factory=dict)
    group_of_cgroup: dict[bytes, Group] = field(default_factory=dict)
    # the processes of `unplaced` (a group of None above not left out by `--pods-only`,
    # as those of `malformed_pids`)
    unplaced_pids: set[int] = field(default_factory=set)


def group_pass(
    deltas: Iterable[ProcessDelta],
    footprints: Iterable[Footprint],
    grouper: Grouper,
    carried: Iterable[CarriedDelta] = (),
) -> Grouped:
    """Sum each process's delta and footprint into its group.

    Every process read whole has a footprint, so its group is found once, there. A process
    whose cgroup file does not parse, or whose group it cannot tell (`UNPLACED`), is left
    out of both and reported. For a non-pod group,
    the directories of its own cgroup are taken from its first process (docs/reference.md §7).

    Processes carried over unread (`carried`, one block per cgroup file as the guard
    took it, with the reader's footprint sums; see `Tracker.advance`) are summed into
    their groups by block: one group lookup per cgroup, not per process. Their cgroup
    files parsed when they were last read.
    """
    intervals: dict[Group, Fields] = {}
    sums: dict[Group, FootprintSums] = {}
    malformed: set[int] = set()
    unplaced = 0
    unplaced_pids: set[int] = set()
    dirs: dict[Group, CgroupDirs] = {}
    group_of_pid: dict[int, Group | None] = {}
    group: Group | _NotRead | None  # `_NOT_READ`: a process with no footprint this pass
    delta: ProcessDelta | CarriedDelta

    def footprint_of(group: Group, cgroup: bytes) -> FootprintSums:
        footprint = sums.get(group)
        if footprint is None:
            footprint = sums[group] = FootprintSums()
            if group.kind == "cgroup":
                dirs[group] = grouper.dirs_of(cgroup)
        return footprint

    def interval_of(group: Group) -> Fields:
        interval = intervals.get(group)
        if interval is None:
            interval = intervals[group] = Fields()
        return interval

    for seen in footprints:
        try:
            group = grouper.group_of(seen.cgroup)
        except Malformed:
            malformed.add(seen.pid)
            group_of_pid[seen.pid] = None
            continue
        if group is UNPLACED:
            unplaced += 1
            unplaced_pids.add(seen.pid)
            group = None
        group_of_pid[seen.pid] = group
        if group is None:
            continue
        footprint = footprint_of(group, seen.cgroup)
        footprint.processes += 1
        footprint.threads += seen.threads
        footprint.rss_bytes += seen.rss_bytes
    for delta in deltas:
        group = group_of_pid.get(delta.reading.pid, _NOT_READ)
        if group is _NOT_READ:  # carried, yet guarded as read: the guard had another reading
            group = group_of_pid[delta.reading.pid] = _group_of_carried(
                grouper, delta.reading.cgroup
            )
        if group is None:  # dropped by --pods-only, unplaced, or its cgroup file is malformed
            continue
        interval_of(group).add(delta.fields)
    group_of_cgroup: dict[bytes, Group] = {}
    for delta in carried:
        block = delta.block
        group = _group_of_carried(grouper, block.cgroup)
        if group is None:
            continue
        group_of_cgroup[block.cgroup] = group
        footprint = footprint_of(group, block.cgroup)
        footprint.processes += len(block.readings)  # every one present, accepted or not
        footprint.threads += block.threads
        footprint.rss_bytes += block.rss_bytes
        if delta.readings:
            interval = interval_of(group)
            interval.processes += len(delta.readings)
            interval.observed_nanos += delta.observed_ns
    return Grouped(
        intervals, sums, malformed, dirs, unplaced, group_of_pid, group_of_cgroup, unplaced_pids
    )


class _NotRead(Enum):
    """`_NOT_READ`'s type: a one-member Enum, a sentinel the checker tells from a group."""

    NOT_READ = "not read"


_NOT_READ: Final = _NotRead.NOT_READ  # a process with no footprint this pass: it was carried


def _group_of_carried(grouper: Grouper, cgroup: bytes) -> Group | None:
    """The group of a carried process, by its cgroup file, as a pass that read it whole
    would find it (a cgroup is carried only where its file parsed into a placed group;
    the check costs nothing). None where it is left out of the sums."""
    try:
        group = grouper.group_of(cgroup)
    except Malformed:
        return None
    return None if group is UNPLACED else group


_counters = attrgetter(*COUNTER_FIELD_NAMES)


class Totals:
    """The guarded deltas accumulated per group since start, for `_total` counters: the
    process fields (docs/reference.md §3) and the cgroup fields (§7) a group has had.

    A group's totals are forgotten `forget_after` passes after the last pass that saw it
    (a process of its, or its cgroup), so the series of a deleted pod go away.
    """

    def __init__(self, forget_after: int = 3):
        self.forget_after = forget_after
        self._totals: dict[Group, Fields] = {}
        self._cgroup_totals: dict[Group, dict[str, int]] = {}
        self._last_seen: dict[Group, int] = {}
        self._passes = 0

    def add_pass(
        self,
        intervals: Mapping[Group, Fields],
        seen: Iterable[Group],
        cgroup_intervals: Mapping[Group, CgroupFields] | None = None,
    ) -> None:
        """Add one pass. `seen`: every group the pass saw, which includes those of
        `intervals` and `cgroup_intervals` (a delta needs a process or a cgroup seen)."""
        self._passes += 1
        now = self._passes
        for group, fields in intervals.items():
            total = self._totals.get(group)
            if total is None:
                total = self._totals[group] = Fields()
            total.add(fields)
        for group, cgroup_fields in (cgroup_intervals or {}).items():
            counters = self._cgroup_totals.setdefault(group, {})
            for name in CGROUP_FIELD_NAMES:
                value = getattr(cgroup_fields, name)
                if value is not None:
                    counters[name] = counters.get(name, 0) + value
        for group in seen:
            self._last_seen[group] = now
        stale = [g for g, last in self._last_seen.items() if now - last >= self.forget_after]
        for group in stale:
            del self._last_seen[group]
            self._totals.pop(group, None)
            self._cgroup_totals.pop(group, None)

    def snapshot(self) -> dict[Group, dict[str, int]]:
        """Per group, the counters it has: the process fields once a process of it
        contributed, and each cgroup field once its cgroup gave a delta for it."""
        snapshot: dict[Group, dict[str, int]] = {
            group: dict(zip(COUNTER_FIELD_NAMES, _counters(fields), strict=True))
            for group, fields in self._totals.items()
        }
        for group, counters in self._cgroup_totals.items():
            snapshot.setdefault(group, {}).update(counters)
        return snapshot

"""Per-group sums: the interval of one pass, the footprint it saw, and running totals."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from collector.groups import Group, Grouper
from collector.model import COUNTER_FIELD_NAMES, Fields, Malformed
from collector.reading import Footprint
from collector.tracker import ProcessDelta


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


def group_pass(
    deltas: Iterable[ProcessDelta], footprints: Iterable[Footprint], grouper: Grouper
) -> Grouped:
    """Sum each process's delta and footprint into its group.

    Every process read whole has a footprint, so its group is found once, there. A process
    whose cgroup file does not parse is left out of both and reported.
    """
    intervals: dict[Group, Fields] = {}
    sums: dict[Group, FootprintSums] = {}
    malformed: set[int] = set()
    group_of_pid: dict[int, Group | None] = {}
    for seen in footprints:
        try:
            group = grouper.group_of(seen.cgroup)
        except Malformed:
            malformed.add(seen.pid)
            continue
        group_of_pid[seen.pid] = group
        if group is None:
            continue
        footprint = sums.get(group)
        if footprint is None:
            footprint = sums[group] = FootprintSums()
        footprint.processes += 1
        footprint.threads += seen.threads
        footprint.rss_bytes += seen.rss_bytes
    for delta in deltas:
        group = group_of_pid.get(delta.reading.pid)
        if group is None:  # dropped by --pods-only, or its cgroup file is malformed
            continue
        interval = intervals.get(group)
        if interval is None:
            interval = intervals[group] = Fields()
        interval.add(delta.fields)
    return Grouped(intervals, sums, malformed)


class Totals:
    """The guarded deltas accumulated per group since start, for `_total` counters.

    A group's totals are forgotten `forget_after` passes after the last pass that saw one
    of its processes, so the series of a deleted pod go away.
    """

    def __init__(self, forget_after: int = 3):
        self.forget_after = forget_after
        self._totals: dict[Group, Fields] = {}
        self._last_seen: dict[Group, int] = {}
        self._passes = 0

    def add_pass(self, intervals: dict[Group, Fields], seen: Iterable[Group]) -> None:
        self._passes += 1
        now = self._passes
        for group, fields in intervals.items():
            total = self._totals.get(group)
            if total is None:
                total = self._totals[group] = Fields()
            total.add(fields)
        for group in seen:
            self._last_seen[group] = now
        for group in intervals:
            self._last_seen[group] = now
        stale = [g for g, last in self._last_seen.items() if now - last >= self.forget_after]
        for group in stale:
            del self._last_seen[group]
            self._totals.pop(group, None)

    def snapshot(self) -> dict[Group, dict[str, int]]:
        return {
            group: {name: getattr(fields, name) for name in COUNTER_FIELD_NAMES}
            for group, fields in self._totals.items()
        }

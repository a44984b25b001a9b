"""The cgroup side of a pass (docs/reference.md §7), one object whose methods run in the
pass's order (`Engine.run_pass`):

1. `Cgroups.begin`, before any process is read: list every pod's cgroup (or container's,
   with `--per-container`) and the cgroups of the non-pod groups the last pass saw, and
   read them. A cgroup whose usage did not move since the last pass's start proves its
   processes quiet (`reading.in_quiet_cgroup`).
2. `CgroupPass.quiet`: that proof, as the predicate the process reader asks.
3. `CgroupPass.finish`, once the processes are grouped: read the cgroups of the non-pod
   groups seen for the first time, guard every reading of the pass (`CgroupTracker`), and
   keep what the next pass reads first.

The causes of waiting are formed from the guard's deltas after, in one place
(`waits.with_waits`), once the node's interval and the groups' CPUs are known.

Without the cgroup fields (`--no-collector.cgroup`) every step reads nothing and gives
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from collector.aggregate import Grouped
from collector.cgroupfs import CgroupFS, Location, usage_hierarchy
from collector.cgroupguard import CgroupAdvance, CgroupTracker
from collector.groups import CgroupDirs, Group, Grouper
from collector.model import CgroupReading, Malformed
from collector.podcgroups import PodCgroups


@dataclass(frozen=True, slots=True)
class CgroupOutcome:
    """A pass's cgroups, guarded: the deltas, refusals and throttled wall time, and the
    groups whose cgroup was read."""

    advance: CgroupAdvance[Group]
    read: frozenset[Group]


class Cgroups:
    """What the cgroup side keeps from pass to pass: last pass's readings (the reader's
    cache, to read less, and the quiet proof's `before`), which of them were read at its
    start, the directories of its non-pod groups, and the guard."""

    def __init__(self, cgroupfs: CgroupFS | None, grouper: Grouper):
        self.cgroupfs = cgroupfs  # None: the cgroup fields are not collected
        self.grouper = grouper
        # where the pods' cgroups are, in the hierarchies the reader found
        self.pods = None if cgroupfs is None else PodCgroups(cgroupfs.hierarchies)
        self.tracker: CgroupTracker[Group] = CgroupTracker()
        self.readings: dict[Group, CgroupReading] = {}  # last pass's
        self.read_early: frozenset[Group] = frozenset()  # read before its processes
        self.dirs: dict[Group, CgroupDirs] = {}  # of its non-pod groups

    def begin(self) -> CgroupPass:
        """Step 1: every known group's cgroup, read before the processes."""
        known = self._known()
        return CgroupPass(self, known, self.read(known))

    def _known(self) -> dict[Group, list[Location]]:
        """Every pod cgroup on the node (or container cgroup, with `--per-container`), and
        the cgroups of the non-pod groups the last pass saw. Pods are listed before the
        processes are grouped: a pod's own directory says its QoS class where a process's
        namespaced path may not (`Grouper.learn_qos`)."""
        if self.pods is None:
            return {}
        grouper = self.grouper
        pods = self.pods.pods(grouper.per_container)
        grouper.learn_qos(pods)
        targets: dict[Group, list[Location]] = {}
        for pod, locations in pods.items():
            targets.setdefault(grouper.pod_group(pod), []).extend(locations)
        for group, dirs in self.dirs.items():
            targets[group] = _locations(dirs)
        return targets

    def read(self, targets: dict[Group, list[Location]]) -> dict[Group, CgroupReading]:
        """The cgroups of `targets`, read less where last pass's readings prove it."""
        if self.cgroupfs is None or not targets:
            return {}
        return self.cgroupfs.read_groups(targets, self.readings)


class CgroupPass:
    """One pass's cgroup side, from `Cgroups.begin`: `quiet`, then `finish`."""

    def __init__(
        self,
        cgroups: Cgroups,
        known: Mapping[Group, list[Location]],
        early: dict[Group, CgroupReading],
    ):
        self._cgroups = cgroups
        self.known = known
        self.early = early  # read at the pass's start

    def quiet(self) -> Callable[[bytes], bool] | None:
        """Step 2: whether a process's cgroup (by its `cgroup` file) did not run since the
        last pass: its group's cgroup, read at the start of this pass and of the last one
        (before the processes were read), is the same cgroup with the same usage, and it
        holds the process: the process's path in the hierarchy the usage came from is
        that cgroup's directory or below it. (A group names its processes by one path;
        a process may sit elsewhere in another hierarchy — at the v2 root beside a v1 pod
        path, say — where that usage does not count it.) None where no group is quiet.

        (A non-pod group seen for the first time is read at the end of its pass, after
        its processes: it proves nothing until it has been read at a pass's start. The
        reader's own rule — it carries only processes whose `cgroup` file read the same
        twice — implies as much; the check here keeps the proof in one place.)"""
        side = self._cgroups
        before, read_early, known = side.readings, side.read_early, self.known
        # the usage's hierarchy and directory (looked up below by `group_of`'s answer, None
        # included: it finds nothing)
        quiet: dict[Group | None, tuple[str, bytes]] = {}
        for group, now in self.early.items():
            if (
                group in read_early
                and now.usage_ns is not None
                and (last := before.get(group)) is not None
                and last.usage_ns == now.usage_ns
                and last.identity == now.identity
            ):
                hierarchy = usage_hierarchy(now)
                where = next((loc.path for loc in known[group] if loc.hierarchy == hierarchy), None)
                if where is not None:
                    quiet[group] = (hierarchy, where)
        if not quiet:
            return None
        answers: dict[bytes, bool]
        grouper, answers = side.grouper, {}

        def in_quiet(cgroup_text: bytes) -> bool:
            answer = answers.get(cgroup_text)
            if answer is None:
                try:
                    usage = quiet.get(grouper.group_of(cgroup_text))
                    answer = usage is not None and _holds(
                        usage[1], grouper.path_in(cgroup_text, usage[0])
                    )
                except Malformed:
                    answer = False
                answers[cgroup_text] = answer
            return answer

        return in_quiet

    def finish(self, grouped: Grouped) -> CgroupOutcome:
        """Step 3: the cgroups of the non-pod groups seen this pass and not read at its
        start, then every reading of the pass through the guard; what the next pass reads
        first."""
        side, early = self._cgroups, self.early
        if side.cgroupfs is None:
            return CgroupOutcome(CgroupAdvance(), frozenset())
        late = side.read(
            {g: _locations(dirs) for g, dirs in grouped.cgroup_dirs.items() if g not in early}
        )
        readings = early | late
        side.readings = readings
        side.read_early = frozenset(early)
        side.dirs = grouped.cgroup_dirs
        side.cgroupfs.release_unused()
        return CgroupOutcome(side.tracker.advance(readings), frozenset(readings))


def _holds(directory: bytes, path: bytes | None) -> bool:
    """Whether a cgroup directory (its path from the hierarchy's root) is `path` or above it."""
    if path is None:
        return False
    return path == directory or path.startswith(directory + b"/")


def _locations(dirs: CgroupDirs) -> list[Location]:
    return [
        Location(hierarchy, path.encode("utf-8", "surrogateescape"), None, False)
        for hierarchy, path in dirs
    ]

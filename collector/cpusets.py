"""Which CPUs each group's running processes may run on (docs/reference.md §7, "The CPUs a
group may use").

A group's CPUs are the union of the effective CPU sets of the cgroups its processes ran in
during the interval (an on-CPU delta above 0): a pod's app container on CPUs the CPU manager
gave it alone, and not its pause container, which never runs; a service pinned to the
reserved CPUs. The set is the cgroup's `cpuset.cpus.effective` (v2, where the cpuset
controller is on: else its nearest ancestor's, the root's at the last) or
`cpuset.effective_cpus` (v1's cpuset hierarchy), each file read once a pass: the CPU
manager narrows the shared pool as pinned containers come.

Two uses: the interval's averages measure a group's own threads against the CPUs it may use,
not the node's (`collector.waits.split_run_delay`), and the page says which groups could
have held which others' CPUs (`procdelta_cpuset_cpus`: a group whose set is another's, or
the whole node's, shares its CPUs).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from collector.cgroupfs import Hierarchies
from collector.groups import Group, Grouper
from collector.model import CpuSet, Malformed
from collector.procfs import read_or_none
from collector.tracker import ProcessDelta

_V2_FILE = b"cpuset.cpus.effective"
_V1_FILE = b"cpuset.effective_cpus"


def parse_cpu_list(data: bytes) -> int:
    """A kernel CPU list (`0-3,8,10-11`, Documentation/admin-guide/cgroup-v2.rst, "Cpuset
    Interface Files") as a bit mask, CPU n at bit n. Raises Malformed on bad text."""
    mask = 0
    text = data.strip()
    if not text:
        return 0
    for part in text.split(b","):
        first, dash, last = part.partition(b"-")
        # a CPU number is below 1 << 16: five digits at most (and int() takes no more
        # than 4,300 without raising ValueError)
        if not first.isdigit() or (dash and not last.isdigit()) or max(len(first), len(last)) > 5:
            raise Malformed("cpuset", data)
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high >= 1 << 16:
            raise Malformed("cpuset", data)
        mask |= ((1 << (high - low + 1)) - 1) << low
    return mask


def format_cpu_list(mask: int) -> str:
    """A bit mask as the kernel writes a CPU list: ranges, lowest first (`0-3,8`)."""
    parts: list[str] = []
    cpu = 0
    while mask >> cpu:
        if not mask >> cpu & 1:
            cpu += 1
            continue
        end = cpu
        while mask >> (end + 1) & 1:
            end += 1
        parts.append(str(cpu) if end == cpu else f"{cpu}-{end}")
        cpu = end + 1
    return ",".join(parts)


class Cpusets:
    """Reads the groups' CPU sets from the cpuset hierarchy under `--path.cgroupfs`: v1's
    `cpuset` where it is mounted, else the v2 tree."""

    def __init__(self, hierarchies: Hierarchies):
        self.v1 = hierarchies.cpuset
        self.v2 = hierarchies.v2 if self.v1 is None else None
        self._masks: dict[bytes, int | None] = {}  # this pass's, by directory

    @property
    def available(self) -> bool:
        return self.v1 is not None or self.v2 is not None

    def node(self) -> int | None:
        """The root's set: every CPU a cgroup may have."""
        root = self.v1 or self.v2
        return None if root is None else self._mask(root, root)

    def of_groups(
        self,
        deltas: Iterable[ProcessDelta],
        group_of_pid: Mapping[int, Group | None],
        grouper: Grouper,
    ) -> dict[Group, int]:
        """Each group's CPUs: the union of the sets of the cgroups its processes that ran
        in the interval ran in. A group none of whose processes ran has none."""
        self._masks = {}
        if not self.available:
            return {}
        hierarchy = "cpuset" if self.v1 is not None else "v2"
        root = self.v1 or self.v2
        assert root is not None
        found: dict[Group, int] = {}
        seen: dict[bytes, int | None] = {}  # by cgroup file
        for delta in deltas:
            if delta.fields.on_cpu_nanos <= 0:
                continue
            group = group_of_pid.get(delta.reading.pid)
            if group is None:
                continue
            text = delta.reading.cgroup
            if text in seen:
                mask = seen[text]
            else:
                try:
                    path = grouper.path_in(text, hierarchy)
                except Malformed:
                    path = None
                mask = seen[text] = None if path is None else self._mask(root, root + path)
            if mask:
                found[group] = found.get(group, 0) | mask
        return found

    def _mask(self, root: bytes, directory: bytes) -> int | None:
        """A directory's effective set; on v2, where it has no cpuset file (the controller
        is off there), its nearest ancestor's."""
        if directory in self._masks:
            return self._masks[directory]
        name = _V1_FILE if root == self.v1 else _V2_FILE
        data = read_or_none(os.fsdecode(directory + b"/" + name))
        mask: int | None = None
        if data is not None:
            try:
                mask = parse_cpu_list(data)
            except Malformed:
                mask = None
        elif self.v2 is not None and directory != root:
            mask = self._mask(root, os.path.dirname(directory))
        self._masks[directory] = mask
        return mask


def cpu_set(mask: int, node: int | None) -> CpuSet:
    """A group's set as the page says it: `all` where it is the node's whole set."""
    return CpuSet("all" if mask == node else format_cpu_list(mask), mask.bit_count())

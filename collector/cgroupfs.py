"""CgroupFS: the one object that touches the cgroup filesystem (SPEC §7).

It finds the hierarchies under `--path.cgroupfs` by what they hold (the host's
`/sys/fs/cgroup`, mounted read-only in a container, or a fixture tree of plain files),
lists the pod cgroups under kubelet's `kubepods` tree, and reads each group's own
counters into a `CgroupReading`. Parsing is left to collector/parse.py.

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
import logging
import os
from dataclasses import dataclass
from typing import NamedTuple

from collector.groups import HIERARCHY_ORDER, PodRef, leads_to_pods, pod_of_dir
from collector.model import Bandwidth, CgroupReading, Malformed, Pressure
from collector.parse import parse_flat_keyed, parse_pressure, parse_single_value

log = logging.getLogger(__name__)

V2, CPU, CPUACCT = HIERARCHY_ORDER

_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.EOPNOTSUPP, errno.EINVAL})
_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_PRESSURE_FILES = (b"cpu.pressure", b"memory.pressure", b"io.pressure")
_KUBEPODS_DEPTH = 4  # kind: kubelet.slice/kubelet-kubepods.slice/…-burstable.slice/…-pod<uid>


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """The hierarchies found under the cgroupfs root (absolute paths, as bytes), and
    whether the v2 tree has pressure (PSI) files."""

    v2: bytes | None = None
    cpu: bytes | None = None
    cpuacct: bytes | None = None
    psi: bool = False

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
    over the cgroups below it (a pod's or a container's: SPEC §7)."""

    hierarchy: str
    path: bytes
    inode: int | None
    subtree: bool


class CgroupFS:
    """Cgroup hierarchies under `root`, found at construction (`rescan()` looks again)."""

    def __init__(self, root: str = "/sys/fs/cgroup", pressure: bool = True):
        self.root = root
        self.pressure = pressure
        self.hierarchies = detect(root)

    def rescan(self) -> bool:
        """Look for the hierarchies again; True if what was found changed."""
        found = detect(self.root)
        changed = found != self.hierarchies
        self.hierarchies = found
        return changed

    # -- listing -----------------------------------------------------------------------

    def pods(self, per_container: bool) -> dict[PodRef, list[Location]]:
        """Every pod cgroup under kubelet's tree, in every hierarchy (with
        `per_container`, every container cgroup of every pod instead)."""
        found: dict[PodRef, list[Location]] = {}
        for hierarchy in HIERARCHY_ORDER:
            root = self.hierarchies.root(hierarchy)
            if root is None:
                continue
            for path, inode in self._pod_dirs(root):
                if per_container:
                    for child, child_inode in _subdirs(root + path):
                        ref = pod_of_dir((path + b"/" + child).decode(errors="replace"))
                        if ref is not None and ref.container_id:
                            location = Location(hierarchy, path + b"/" + child, child_inode, True)
                            found.setdefault(ref, []).append(location)
                    continue
                ref = pod_of_dir(path.decode(errors="replace"))
                if ref is not None:
                    found.setdefault(ref, []).append(Location(hierarchy, path, inode, True))
        return found

    def _pod_dirs(self, root: bytes) -> list[tuple[bytes, int]]:
        """(path, inode) of each pod directory: a walk down the kubepods directories only
        (a few scandir calls), never the whole tree."""
        pods: list[tuple[bytes, int]] = []
        stack: list[tuple[bytes, str, int]] = [(b"", "", 0)]
        while stack:
            path, name, depth = stack.pop()
            for child, inode in _subdirs(root + path):
                text = child.decode(errors="replace")
                if pod_of_dir("/" + text) is not None:
                    pods.append((path + b"/" + child, inode))
                elif depth < _KUBEPODS_DEPTH and leads_to_pods(text, name):
                    stack.append((path + b"/" + child, text, depth + 1))
        pods.sort()
        return pods

    # -- reading -----------------------------------------------------------------------

    def read_group(self, locations: list[Location]) -> CgroupReading | None:
        """A group's cgroup counters from its directories, each field from the first
        hierarchy (v2, then v1 `cpu`, `cpuacct`) that has it. None if none of its
        directories could be read (the cgroup is gone)."""
        identity: list[tuple[str, int]] = []
        usage: int | None = None
        pressure: tuple[Pressure | None, Pressure | None, Pressure | None] = (None, None, None)
        bandwidth: tuple[Bandwidth, ...] | None = None
        for location in sorted(locations, key=lambda loc: HIERARCHY_ORDER.index(loc.hierarchy)):
            root = self.hierarchies.root(location.hierarchy)
            if root is None:
                continue
            directory = root + location.path
            inode = location.inode
            if inode is None:
                try:
                    inode = os.stat(directory).st_ino
                except OSError:
                    continue
            hierarchy = location.hierarchy
            if hierarchy == V2:
                stat = _keyed(directory + b"/cpu.stat")
                if stat is None:
                    continue  # gone, or not a cgroup: nothing read from this hierarchy
                if b"usage_usec" in stat:
                    usage = stat[b"usage_usec"] * 1000
                if bandwidth is None and b"nr_periods" in stat:
                    bandwidth = self._bandwidth(root, location, inode, stat)
                if self.pressure and self.hierarchies.psi:
                    pressure = tuple(_pressure(directory + b"/" + f) for f in _PRESSURE_FILES)
            elif hierarchy == CPU:
                if bandwidth is not None:
                    continue
                stat = _keyed(directory + b"/cpu.stat")
                if stat is None:
                    continue
                bandwidth = self._bandwidth(root, location, inode, stat)
            else:  # CPUACCT
                if usage is not None:
                    continue
                usage = _single(directory + b"/cpuacct.usage")
                if usage is None:
                    continue
            identity.append((hierarchy, inode))
        if not identity:
            return None
        return CgroupReading(tuple(identity), usage, pressure, bandwidth)

    def _bandwidth(
        self, root: bytes, location: Location, inode: int, stat: dict[bytes, int]
    ) -> tuple[Bandwidth, ...] | None:
        """The bandwidth counters of the group's cgroup and, for a pod, of every cgroup
        below it: the kernel keeps them per cgroup, for that cgroup's own quota."""
        own = _bandwidth(b"", inode, stat)
        if own is None:
            return None
        found = [own]
        if location.subtree:
            stack = [(b"", root + location.path)]
            while stack:
                relative, directory = stack.pop()
                for child, child_inode in _subdirs(directory):
                    path = relative + b"/" + child
                    stat = _keyed(directory + b"/" + child + b"/cpu.stat")
                    counters = None if stat is None else _bandwidth(path, child_inode, stat)
                    if counters is not None:
                        found.append(counters)
                    stack.append((path, directory + b"/" + child))
        return tuple(found)


def _bandwidth(path: bytes, inode: int, stat: dict[bytes, int]) -> Bandwidth | None:
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


def _subdirs(directory: bytes) -> list[tuple[bytes, int]]:
    """(name, inode) of the directories in `directory`; none if it is gone."""
    try:
        with os.scandir(directory) as entries:
            return [(e.name, e.inode()) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _read(path: bytes) -> bytes | None:
    """A small cgroup file's bytes, or None where it does not exist (or is gone)."""
    try:
        fd = os.open(path, _FLAGS)
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


def _keyed(path: bytes) -> dict[bytes, int] | None:
    data = _read(path)
    if data is None:
        return None
    try:
        return parse_flat_keyed(data)
    except Malformed as error:
        log.debug("%s: %s", path, error)
        return None


def _single(path: bytes) -> int | None:
    data = _read(path)
    if data is None:
        return None
    try:
        return parse_single_value(data)
    except Malformed as error:
        log.debug("%s: %s", path, error)
        return None


def _pressure(path: bytes) -> Pressure | None:
    data = _read(path)
    if data is None:
        return None
    try:
        return parse_pressure(data)
    except Malformed as error:
        log.debug("%s: %s", path, error)
        return None

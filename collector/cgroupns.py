"""Where the reader's cgroup namespace sits on the host (docs/reference.md §4).

`/proc/<pid>/cgroup` shows each path relative to the root of the *reader's* cgroup
namespace. A collector in a container with a namespace of its own (the default on cgroup
v2 nodes) reads `0::/` for itself, `/../<sibling>` for the other containers of its pod and
`/../../…` for everything else. `CgroupNamespace.host_path` turns such a path back into
the host's, given the host path of the namespace's root in each hierarchy; `locate`
finds those roots once, at start-up.

How a root is found: the reader's own cgroup, in the host's tree mounted at
`--path.cgroupfs`, is the directory whose `cgroup.procs` lists the reader's PID (the
kernel shows the PIDs of that file in the reader's PID namespace, so the reader's own is
there whatever namespaces it runs in). The root is that directory less the reader's own
path as its namespace shows it (`/`, unless it moved after the namespace was made). A
hierarchy whose root is not found places no path: a process whose group only such a path
could tell is counted as unplaced, never given a label that may name the wrong cgroup.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from collector.model import CgroupLine, Malformed
from collector.parse import parse_cgroup
from collector.procfs import read_or_none


class Hierarchies(Protocol):
    """The host's hierarchies (`collector.cgroupfs.Hierarchies`, which imports the groups
    that import this): the directory of `v2`, `cpu` or `cpuacct`, or None."""

    def root(self, hierarchy: str) -> bytes | None: ...


log = logging.getLogger(__name__)

INIT_CGROUP_NS_INODE = 0xEFFFFFFB
"""The inode of the initial cgroup namespace (`PROC_CGROUP_INIT_INO`, include/linux/proc_ns.h)."""

SEARCHED_DIRECTORIES = 100_000
"""At most this many directories of a hierarchy are searched for the reader's cgroup."""


def _relative(path: str) -> bool:
    """Whether a path climbs out of the namespace's root (`/..`, `/../x`)."""
    return path == "/.." or path.startswith("/../")


def join_path(root: str, path: str) -> str | None:
    """`path` (as a namespace rooted at host path `root` shows it) as a host path; None if
    it would climb above the host's root, which no real path does."""
    parts: list[str] = []
    for segment in (*root.split("/"), *path.split("/")):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(segment)
    return "/" + "/".join(parts)


@dataclass(frozen=True, slots=True)
class CgroupNamespace:
    """How the paths of `/proc/<pid>/cgroup`, as this process reads them, become host paths.

    `roots` is None in the host's own namespace (every path is the host's already);
    otherwise it holds, by hierarchy ID, the host path of the namespace's root, for the
    hierarchies where it was found.
    """

    roots: Mapping[int, str] | None = None
    missing: tuple[str, ...] = ()  # the hierarchies whose root was looked for, not found

    @property
    def complete(self) -> bool:
        """Whether every path read is placed: the host's namespace, or a root found in
        each hierarchy of the host's tree (`procdelta_source_available`)."""
        return self.roots is None or (bool(self.roots) and not self.missing)

    def host_path(self, line: CgroupLine) -> str | None:
        """The host path of one line of a cgroup file, or None where it cannot be known."""
        if self.roots is None:
            return None if _relative(line.path) else line.path
        root = self.roots.get(line.hierarchy)
        return None if root is None else join_path(root, line.path)


HOST = CgroupNamespace()
"""The host's own cgroup namespace: paths are read as they are."""


def _namespace_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def shares_hosts_namespace(procfs: str, own: str = "/proc/self/ns/cgroup") -> bool:
    """Whether this process is in the cgroup namespace of the node's init (`<procfs>/1`),
    or, where that cannot be read (a fixture tree), in the initial one. A kernel without
    cgroup namespaces has only the host's."""
    mine = _namespace_inode(own)
    if mine is None:
        return True
    node = _namespace_inode(os.path.join(procfs, "1", "ns", "cgroup"))
    return mine == (node if node is not None else INIT_CGROUP_NS_INODE)


def _walk(root: bytes) -> Iterator[bytes]:
    """The directories of a hierarchy, breadth first, from `root` (paths from it)."""
    queue = [b""]
    for path in queue:
        yield path
        if len(queue) >= SEARCHED_DIRECTORIES:
            continue
        try:
            entries = os.scandir(root + path if path else root)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    queue.append(path + b"/" + entry.name)


def find_cgroup_of(root: bytes, pid: int) -> str | None:
    """The path, from a hierarchy's root, of the cgroup whose `cgroup.procs` lists `pid`."""
    wanted = str(pid).encode()
    for path in _walk(root):
        procs = read_or_none(os.fsdecode(root + path + b"/cgroup.procs"))
        if procs is not None and wanted in procs.split():
            return os.fsdecode(path) or "/"
    return None


def root_from(found: str, own: str) -> str | None:
    """The host path of a namespace's root, from the host path of the reader's cgroup and
    the path its namespace shows for it; None where the reader sits outside its root."""
    if own == "/":
        return found
    if found == own:
        return "/"
    if not _relative(own) and found.endswith(own):
        return found[: -len(own)]
    return None


def _hierarchy_of(line: CgroupLine, hierarchies: Hierarchies) -> bytes | None:
    """The host tree's directory of the hierarchy a cgroup line is in."""
    if line.hierarchy == 0 and not line.controllers:
        return hierarchies.root("v2")
    for controller in ("cpu", "cpuacct"):
        if controller in line.controllers:
            return hierarchies.root(controller)
    return None


def locate(
    procfs: str,
    hierarchies: Hierarchies,
    own_cgroup: str = "/proc/self/cgroup",
    own_namespace: str = "/proc/self/ns/cgroup",
    pid: int | None = None,
) -> CgroupNamespace:
    """This process's cgroup namespace and where its root sits in each hierarchy of the
    host's tree (`hierarchies`, under `--path.cgroupfs`). Said once, at start-up: where
    the reader runs, and each hierarchy whose root it could not find."""
    if shares_hosts_namespace(procfs, own_namespace):
        return HOST
    text = read_or_none(own_cgroup)
    try:
        lines = parse_cgroup(text or b"")
    except Malformed:
        lines = ()
    pid = os.getpid() if pid is None else pid
    roots: dict[int, str] = {}
    missing: list[str] = []
    for line in lines:
        name = ",".join(line.controllers) or "v2"
        tree = _hierarchy_of(line, hierarchies)
        if tree is None:
            continue
        found = find_cgroup_of(tree, pid)
        root = root_from(found, line.path) if found is not None else None
        if root is None:
            missing.append(name)
        else:
            roots[line.hierarchy] = root
            log.info("cgroup namespace of its own: its root in the %s hierarchy is %s", name, root)
    if missing or not roots:
        log.warning(
            "procdelta runs in a cgroup namespace of its own and could not find its root "
            "in the host's cgroup tree under %s (hierarchies: %s; mount the host's "
            "/sys/fs/cgroup there): a process whose group only such a path tells is not "
            'placed, and is counted in procdelta_dropped_deltas_total{reason="unplaced"}',
            os.fsdecode(hierarchies.root("v2") or hierarchies.root("cpu") or b"--path.cgroupfs"),
            ", ".join(missing) or "none mounted",
        )
    return CgroupNamespace(MappingProxyType(roots), tuple(missing))

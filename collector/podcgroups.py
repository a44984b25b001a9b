"""PodCgroups: where the pods' (or containers') cgroups are, in every hierarchy
`collector.cgroupfs.detect` found: a walk down kubelet's `kubepods` directories each pass,
which hands out the last pass's answer again where no listing changed. `CgroupFS` reads
the counters of what it finds.

Every directory on the way is listed every pass (a few `scandir` calls, never the whole
tree); what a listing holds is worked out anew only where it differs from the same
directory's at the last pass (a name or an inode).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from collector import cgroupfs
from collector.cgroupfs import Hierarchies, Location
from collector.groups import (
    HIERARCHY_ORDER,
    PodRef,
    container_of_dir,
    leads_to_pods,
    pod_of_dir,
)
from collector.memo import make_room

_KUBEPODS_DEPTH = 4  # kind: kubelet.slice/kubelet-kubepods.slice/…-burstable.slice/…-pod<uid>

Listing = list[tuple[bytes, int]]
"""(name, inode) of each directory in a directory (`subdirs`)."""
Found = list[tuple[PodRef, bytes, int]]
"""(pod or container, path from the hierarchy's root, inode) of each one found."""


class _Listed(NamedTuple):
    """A directory of kubelet's tree as the last walk listed it: the pods found in it,
    and the directories below it to walk (each with the names of its parents)."""

    listing: Listing
    pods: Found
    below: list[tuple[bytes, tuple[str, ...]]]


class _Walk(NamedTuple):
    """The last walk of one hierarchy: every directory walked, by path, and the pods
    found in all of them, in the order of their paths."""

    seen: dict[bytes, _Listed]
    pods: Found


class _PodDir(NamedTuple):
    """A pod's directory as the last pass listed it, and the containers found in it."""

    listing: Listing
    containers: Found


class _Containers(NamedTuple):
    """The last pass's containers of one hierarchy: the pods they were looked for in
    (the very list `_pod_dirs` gave), each pod directory, and the containers found."""

    pods: Found | None
    pod_dirs: dict[bytes, _PodDir]
    containers: Found


class _Made(NamedTuple):
    """The last answer of `pods`: what each hierarchy's walk found (the very lists), and
    the `Location`s made from them."""

    found: list[tuple[str, Found]]
    locations: dict[PodRef, tuple[Location, ...]]


class PodCgroups:
    """The pod (or container) cgroups under kubelet's tree, in every hierarchy of
    `hierarchies`."""

    def __init__(self, hierarchies: Hierarchies):
        self.hierarchies = hierarchies
        self._real: dict[bytes, bytes] = {}  # hierarchy root → its real path
        self._dirs: dict[tuple[tuple[str, ...], bytes], tuple[PodRef | None, bool]] = {}
        self._walks: dict[bytes, _Walk] = {}  # by hierarchy root
        self._containers: dict[bytes, _Containers] = {}  # by hierarchy root
        self._made = _Made([], {})

    def pods(self, per_container: bool) -> dict[PodRef, tuple[Location, ...]]:
        """Every pod cgroup under kubelet's tree, in every hierarchy (with
        `per_container`, every container cgroup of every pod instead). Where no listing
        differs from the last pass's, the last pass's pods and `Location`s are handed out
        again (tuples: immutable, shared between passes)."""
        lists: list[tuple[str, Found]] = []
        listed: dict[bytes, Found] = {}
        for hierarchy in HIERARCHY_ORDER:
            root = self.hierarchies.root(hierarchy)
            if root is None:
                continue
            # co-mounted controllers (`cpu` and `cpuacct` both linking to `cpu,cpuacct`)
            # are one tree: listed once
            real = self._real.get(root) or self._real.setdefault(root, os.path.realpath(root))
            if real not in listed:
                pods = self._pod_dirs(root)
                listed[real] = self._container_dirs(root, pods) if per_container else pods
            lists.append((hierarchy, listed[real]))
        last = self._made.found
        if len(last) == len(lists) and all(
            hierarchy == before and found is found_before
            for (hierarchy, found), (before, found_before) in zip(lists, last, strict=True)
        ):
            return dict(self._made.locations)
        found: dict[PodRef, list[Location]] = {}
        for hierarchy, entries in lists:
            for ref, path, inode in entries:
                found.setdefault(ref, []).append(Location(hierarchy, path, inode, True))
        self._made = _Made(lists, {ref: tuple(locations) for ref, locations in found.items()})
        return dict(self._made.locations)

    def _pod_dirs(self, root: bytes) -> Found:
        """(pod, path, inode) of each pod directory: a walk down the kubepods directories
        only. Where every directory listed the same as at the last walk, the last walk's
        list (a walk goes where its listings lead: the same listings, the same walk)."""
        before, pods = self._walks.get(root, _Walk({}, []))
        changed = root not in self._walks
        walked: dict[bytes, _Listed] = {}
        stack: list[tuple[bytes, tuple[str, ...]]] = [(b"", ())]
        while stack:
            path, parents = stack.pop()
            listing = cgroupfs.subdirs(root + path)  # by the module: the bench counts its calls
            seen = before.get(path)
            if seen is None or seen.listing != listing:
                changed = True
                here: Found = []
                below: list[tuple[bytes, tuple[str, ...]]] = []
                for child, inode in listing:
                    pod, descend = self._classify_dir(parents, child)
                    if pod is not None:
                        here.append((pod, path + b"/" + child, inode))
                    elif descend:
                        below.append(
                            (path + b"/" + child, (*parents, child.decode(errors="replace")))
                        )
                seen = _Listed(listing, here, below)
            walked[path] = seen
            stack.extend(seen.below)
        if changed:
            pods = [pod for seen in walked.values() for pod in seen.pods]
            pods.sort(key=lambda found: found[1])
        self._walks[root] = _Walk(walked, pods)
        return pods

    def _container_dirs(self, root: bytes, pods: Found) -> Found:
        """(container, path, inode) of each container directory of the `pods`: the last
        pass's list where the pods and every pod directory's listing are the same."""
        pods_before, before, containers = self._containers.get(root, _Containers(None, {}, []))
        changed = pods is not pods_before
        pod_dirs: dict[bytes, _PodDir] = {}
        for pod, path, _ in pods:
            listing = cgroupfs.subdirs(root + path)
            seen = before.get(path)
            if seen is None or seen.listing != listing:
                changed = True
                here: Found = []
                for child, child_inode in listing:
                    container = container_of_dir(pod, child.decode(errors="replace"))
                    if container is not None:
                        here.append((container, path + b"/" + child, child_inode))
                seen = _PodDir(listing, here)
            pod_dirs[path] = seen
        if changed:
            containers = [entry for seen in pod_dirs.values() for entry in seen.containers]
        self._containers[root] = _Containers(pods, pod_dirs, containers)
        return containers

    def _classify_dir(self, parents: tuple[str, ...], child: bytes) -> tuple[PodRef | None, bool]:
        """(the pod a directory is, whether to look below it), remembered: a node's pod
        directories are listed every pass and change a few at a time."""
        key = (parents, child)
        known = self._dirs.get(key)
        if known is None:
            make_room(self._dirs)
            name = child.decode(errors="replace")
            pod = pod_of_dir(list(parents), name) if "pod" in name else None
            descend = pod is None and len(parents) < _KUBEPODS_DEPTH
            known = self._dirs[key] = (pod, descend and leads_to_pods(name, (parents or ("",))[-1]))
        return known

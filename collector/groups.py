"""Which group a process belongs to (docs/reference.md §4).

`classify` is a pure function from the text of `/proc/<pid>/cgroup` to a `PodRef` (a
kubelet pod segment was found) or a cgroup path; `Grouper` remembers its answers and
names the pods' groups with `collector.podnames.PodNames`, the reader of kubelet's files.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from collector.cgroupns import HOST, CgroupNamespace
from collector.memo import make_room
from collector.model import CgroupLine
from collector.parse import parse_cgroup
from collector.podnames import PodNames

log = logging.getLogger(__name__)

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# `pod<uid>` (cgroupfs driver) or `<prefix>-pod<uid_with_underscores>.slice` (systemd driver),
# where prefix is kubepods, kubepods-<qos>, or a nested kubelet's kubelet-kubepods[-<qos>].
# The v1 `name=systemd` form appends `:<runtime>:<container id>` to the slice.
_POD_SEGMENT = re.compile(
    rf"^(?:(?P<prefix>[a-z0-9-]*kubepods(?:-(?P<sqos>burstable|besteffort))?)-)?"
    rf"pod(?P<uid>{_UID})(?:\.slice)?(?::(?P<runtime>[a-z-]+):(?P<cid>[0-9a-zA-Z]+))?$"
)
# A container's own cgroup below its pod: `cri-containerd-<id>.scope`, `crio-<id>.scope`,
# `docker-<id>.scope`, `crio-conmon-<id>.scope` (the runtime's monitor), or a bare id.
_CONTAINER_SEGMENT = re.compile(
    r"^(?:(?P<runtime>[a-z][a-z-]*?)-)?(?P<cid>[0-9a-f]{12,})(?:\.scope)?$"
)
_CONMON_RUNTIMES = frozenset({"crio-conmon"})


@dataclass(frozen=True, slots=True)
class PodRef:
    """A process's pod, as its cgroup path tells it."""

    uid: str
    qos: str
    container_id: str


class Group(NamedTuple):
    """A group's identity: its kind (`pod` or `cgroup`) and its label pairs, in order.

    A NamedTuple, not a frozen dataclass: groups are dictionary keys in every pass and
    in every render of /metrics (~20 lookups per group), and a tuple hashes and compares
    in C where a dataclass runs a Python `__hash__` and `__eq__`.
    """

    kind: str
    labels: tuple[tuple[str, str], ...]

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


UNPLACED = Group("unplaced", ())
"""What `Grouper.group_of` says of a process whose group its cgroup file cannot tell (a
path seen from a cgroup namespace whose root was not found on the host): it is counted,
never summed or published."""


def strip_namespace_prefix(path: str) -> str:
    """A path seen from another cgroup namespace starts with `/..` segments: drop them."""
    while path.startswith("/.."):
        rest = path[3:]
        if rest and not rest.startswith("/"):
            break
        path = rest or "/"
    return path


_LOOKS_ESCAPED = re.compile(r"\\x[89a-f][0-9a-f]")
"""What `label_of` makes of a byte that is not UTF-8 (always 0x80 or above)."""


def label_of(path: str) -> str:
    """A cgroup path (its bytes not UTF-8 held as surrogates, as `parse_cgroup` reads
    them) as a label value, which must be UTF-8, two paths never one label. A path in
    UTF-8 is itself (systemd's `\\x2d` escapes included), unless it holds what an escaped
    byte looks like (`\\x80` to `\\xff`); such a path, and a path not in UTF-8, has each
    backslash doubled and each byte that is not UTF-8 written `\\xNN`. So an escaped
    label always holds a `\\xNN` of 80 or above and a label as read never does, and the
    escaping is undone one way only."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raw = path.encode("utf-8", "surrogateescape")
        return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    if "\\x" in path and _LOOKS_ESCAPED.search(path):
        return path.replace("\\", "\\\\")
    return path


class _Conmon(enum.Enum):
    """What `_pod_or_conmon` says of a path into a pod's conmon scope."""

    SCOPE = "conmon"


def _pod_or_conmon(path: str, root: str = "/") -> PodRef | _Conmon | None:
    """The pod of a path, `_Conmon.SCOPE` for the runtime's monitor in a pod, or None.

    A pod segment counts only where kubelet puts pods (`kubelet_placed`): whoever may
    make a cgroup elsewhere (a systemd delegation, a rootless runtime) cannot name a real
    pod's UID in it and add their processes to that pod. `root`: where the reader's cgroup
    namespace sits on the host in this hierarchy, the other top a kubelet may have."""
    relative = path == "/.." or path.startswith("/../")
    segments = [s for s in strip_namespace_prefix(path).split("/") if s]
    for index, segment in enumerate(segments):
        match = _POD_SEGMENT.match(segment)
        if match is None:
            continue
        if not kubelet_placed(segments[:index], relative, root) and not (
            match["cid"] is not None
            and runtime_placed(segments[:index], match["runtime"], relative, root)
        ):
            return None
        uid = match["uid"].replace("_", "-")
        qos = _qos(segments[:index], match)
        if match["cid"] is not None:
            if match["runtime"] in _CONMON_RUNTIMES:
                return _Conmon.SCOPE
            return PodRef(uid, qos, match["cid"])
        container_id = ""
        if index + 1 < len(segments):
            container = _CONTAINER_SEGMENT.match(segments[index + 1])
            if container is not None:
                if container["runtime"] in _CONMON_RUNTIMES:
                    return _Conmon.SCOPE
                container_id = container["cid"]
        return PodRef(uid, qos, container_id)
    return None


def kubelet_placed(parents: list[str], relative: bool = False, root: str = "/") -> bool:
    """Whether a pod directory below `parents` (the segments above it) is where kubelet
    puts pods: below a kubepods directory at the top of the hierarchy (`kubepods`,
    `kubepods.slice`; kind's `kubelet.slice`), or at the top of the reader's cgroup
    namespace `root`, through kubepods and QoS directories only. A path seen from a
    namespace whose root was not found (`relative`: its leading `/..` dropped) has lost
    its top: every segment left above the pod must be one of kubelet's."""
    if relative:
        return all(_KUBEPODS_DIR.match(name) or name in _QOS_DIR for name in parents)
    top = [s for s in root.split("/") if s]
    if top and parents[: len(top)] == top:
        parents = parents[len(top) :]
    if not parents or not _KUBELET_TOP.match(parents[0]):
        return False
    return all(leads_to_pods(parents[i], parents[i - 1]) for i in range(1, len(parents)))


_RUNTIME_SERVICES = {
    "cri-containerd": "containerd.service",
    "crio": "crio.service",
    "docker": "docker.service",
}
"""The systemd unit of each runtime that names a container `<slice>:<runtime>:<id>`."""
_SERVICE_SLICES = frozenset({"system.slice", "kuberuntime.slice"})


def runtime_placed(
    parents: list[str], runtime: str, relative: bool = False, root: str = "/"
) -> bool:
    """Whether a container directory in runc's systemd form, `<pod slice>:<runtime>:<id>`,
    below `parents` is where the runtime itself puts it: on cgroup v1 with the systemd
    driver, runc makes that literal name in each controller's tree below the runtime's own
    cgroup (`/system.slice/containerd.service`, `/kuberuntime.slice/containerd.service`,
    kubernetes#106514), or at the top of the hierarchy. Only root makes a cgroup there: the
    units of `system.slice` and `kuberuntime.slice` are the system manager's (a delegation
    to a user is below `user.slice`, or below the delegated unit's own cgroup, never a
    runtime's), and the top of a hierarchy is root's. The runtime named must be the one
    whose service holds it."""
    if relative:
        return False
    top = [s for s in root.split("/") if s]
    if top and parents[: len(top)] == top:
        parents = parents[len(top) :]
    if not parents:
        return True
    service = _RUNTIME_SERVICES.get(runtime)
    return len(parents) == 2 and parents[0] in _SERVICE_SLICES and parents[1] == service


def host_path_in(
    cgroup_text: bytes, hierarchy: str, namespace: CgroupNamespace = HOST
) -> str | None:
    """The host path of a process in one hierarchy (`v2`, `cpu` or `cpuacct`), from its
    cgroup file; None where the file has no such line or it cannot be placed. Raises
    Malformed on bad text."""
    for line in parse_cgroup(cgroup_text):
        if (hierarchy == "v2" and _is_v2(line)) or hierarchy in line.controllers:
            return namespace.host_path(line)
    return None


def pod_of_dir(parents: list[str], name: str) -> PodRef | None:
    """The pod whose own cgroup directory is `name`, under directories `parents` (from
    the hierarchy's root), or None: one pattern match, the QoS class from the path."""
    match = _POD_SEGMENT.match(name)
    if match is None or match["cid"] is not None or not kubelet_placed(parents):
        return None
    return PodRef(match["uid"].replace("_", "-"), _qos(parents, match), "")


def container_of_dir(pod: PodRef, name: str) -> PodRef | None:
    """The container whose cgroup directory `name` is, below its pod's; None for what is
    not a container's, or is the runtime's monitor (CRI-O's conmon)."""
    match = _CONTAINER_SEGMENT.match(name)
    if match is None or match["runtime"] in _CONMON_RUNTIMES:
        return None
    return PodRef(pod.uid, pod.qos, match["cid"])


_KUBEPODS_DIR = re.compile(r"^(?:[a-z0-9-]*kubepods[a-z0-9-]*(?:\.slice)?|kubelet\.slice)$")
_QOS_DIR = frozenset({"burstable", "besteffort"})
_KUBELET_TOP = re.compile(r"^(?:[a-z0-9-]*kubepods[a-z0-9-]*(?:\.slice)?|kubelet(?:\.slice)?)$")
"""A directory at the top of a hierarchy under which kubelet puts pods: its kubepods, or
the cgroup of a kubelet nested in a node container (kind: `kubelet.slice`, `kubelet`)."""


def leads_to_pods(name: str, parent: str) -> bool:
    """Whether a cgroup directory named `name` (under one named `parent`) may hold pod
    cgroups: kubelet's `kubepods` tree in either driver (`kubepods.slice`,
    `kubepods-burstable.slice`, `kubepods/burstable`), or kind's nested kubelet
    (`kubelet.slice/kubelet-kubepods.slice`)."""
    if _KUBEPODS_DIR.match(name):
        return True
    return name in _QOS_DIR and "kubepods" in parent


def _qos(parents: list[str], match: re.Match[str]) -> str:
    if match["sqos"]:
        return match["sqos"]
    if match["prefix"]:
        return "guaranteed"  # `kubepods-pod<uid>.slice`: directly under kubepods
    # cgroupfs driver: the parent directory names the class, or is kubepods itself.
    if parents:
        parent = parents[-1]
        if parent in _QOS_DIR:
            return parent
        if parent == "kubepods" or parent.endswith("kubepods"):
            return "guaranteed"
    return ""


def _is_v2(line: CgroupLine) -> bool:
    return line.hierarchy == 0 and not line.controllers


def group_path(lines: tuple[CgroupLine, ...]) -> str | None:
    """The cgroup label of a process outside any pod: its v2 path, or the v1 `cpu` path,
    from lines whose paths are the host's (`CgroupNamespace.host_path`).

    On a hybrid host both exist; the more specific one wins (v2 unless it is the root).
    None when neither (nor, on a host with neither, any other hierarchy) was placed.
    """
    v2 = next((line.path for line in lines if _is_v2(line)), None)
    cpu = next((line.path for line in lines if "cpu" in line.controllers), None)
    if v2 is not None and (v2 != "/" or cpu is None):
        return v2
    if cpu is not None:
        return cpu
    return lines[0].path if lines else None


HIERARCHY_ORDER = ("v2", "cpu", "cpuacct")
"""The hierarchies a group's cgroup fields are read from, in the order they are tried."""

CgroupDirs = tuple[tuple[str, str], ...]
"""(hierarchy, path) of a group's own cgroup in each hierarchy that holds it: `v2`, and
the v1 controllers `cpu` and `cpuacct` (docs/reference.md §7)."""


@dataclass(frozen=True, slots=True)
class Classified:
    """What a cgroup file says: a pod, or else the cgroup path that names the group and
    where that cgroup's own directories are."""

    pod: PodRef | None
    cgroup: str | None  # None: its path could not be placed on the host (`classify`)
    dirs: CgroupDirs = ()


def cgroup_dirs(lines: tuple[CgroupLine, ...], label: str) -> CgroupDirs:
    """Where a non-pod group's own cgroup counters are: each hierarchy in which the process
    sits at the group's path, `label` (lines with the host's paths). Never the root (its
    counters are the whole machine's), never a hierarchy where the process sits elsewhere
    (on a hybrid host the v1 controllers often hold every service at the root)."""
    if label == "/":
        return ()
    dirs: list[tuple[str, str]] = []
    for line in lines:
        if line.path != label:
            continue
        if _is_v2(line):
            dirs.append(("v2", label))
        for controller in ("cpu", "cpuacct"):
            if controller in line.controllers:
                dirs.append((controller, label))
    return tuple(sorted(set(dirs), key=lambda d: HIERARCHY_ORDER.index(d[0])))


def classify(cgroup_text: bytes, namespace: CgroupNamespace = HOST) -> Classified:
    """The group of a process from the bytes of its `/proc/<pid>/cgroup`, its paths read
    as the host's through `namespace` (docs/reference.md §4).

    v2 first, then v1 `cpu`, then any other hierarchy (e.g. `name=systemd`): on cgroup v1
    every controller holds a pod's processes at the same kubelet path. A path that cannot
    be placed on the host still names its pod where the pod's segment shows in it
    (`/../../pod<uid>/<id>`); it never names a cgroup. A process outside any pod whose
    path cannot be placed has no label (`Classified.cgroup` is None).
    """
    lines = parse_cgroup(cgroup_text)
    hosts = [namespace.host_path(line) for line in lines]
    ordered = sorted(
        zip(lines, hosts, strict=True),
        key=lambda pair: (not _is_v2(pair[0]), "cpu" not in pair[0].controllers),
    )
    roots = namespace.roots or {}
    for line, host in ordered:
        pod = _pod_or_conmon(line.path if host is None else host, roots.get(line.hierarchy, "/"))
        if pod is _Conmon.SCOPE:
            break  # the runtime's own process: no other hierarchy makes it a pod's
        if pod is not None:
            return Classified(pod, "")
    # Outside any pod, the label is the v2 or the v1 cpu path: each must be placed, or the
    # one left out might be the one that names the group.
    if any(
        host is None and (_is_v2(line) or "cpu" in line.controllers)
        for line, host in zip(lines, hosts, strict=True)
    ):
        return Classified(None, None)
    placed = tuple(
        line._replace(path=host) for line, host in zip(lines, hosts, strict=True) if host
    )
    label = group_path(placed)
    if label is None:
        return Classified(None, None)
    return Classified(None, label, cgroup_dirs(placed, label))


class Grouper:
    """Turns a process's cgroup bytes into its `Group`, with names from `PodNames`."""

    def __init__(
        self,
        names: PodNames,
        per_container: bool = False,
        pods_only: bool = False,
        namespace: CgroupNamespace = HOST,
    ):
        self.names = names
        self.per_container = per_container
        self.pods_only = pods_only
        self.namespace = namespace  # how the paths this process reads become the host's
        # by the bytes of a cgroup file: its group and its own cgroup's directories
        self._groups: dict[bytes, tuple[Group | None, CgroupDirs]] = {}
        self._paths: dict[tuple[bytes, str], bytes | None] = {}  # `path_in`, remembered
        self._qos: dict[str, str] = {}  # by pod UID, from the pod's cgroup directory
        self._pod_groups: dict[PodRef, Group] = {}  # `pod_group`, remembered

    def refresh(self) -> None:
        """Follow kubelet's files; forget the groups made with names that may be stale."""
        if self.names.refresh():
            self._groups.clear()
            self._pod_groups.clear()

    def learn_qos(self, pods: Iterable[PodRef]) -> None:
        """The QoS class of each pod, as its own cgroup directory's path tells it.

        A process seen from another cgroup namespace has a path relative to that
        namespace (`/../../pod<uid>/<id>`, its leading `/..` dropped), which may have lost
        the QoS directory above the pod; the pod's directory, found from the hierarchy's
        root, has not. Groups made without it are made again.
        """
        learned = {pod.uid: pod.qos for pod in pods if pod.qos}
        if learned != self._qos:
            self._qos = learned
            self._groups.clear()
            self._pod_groups.clear()

    def group_of(self, cgroup_text: bytes) -> Group | None:
        """The group, None when `--pods-only` drops it, or `UNPLACED`. Raises Malformed on
        bad text."""
        try:
            return self._groups[cgroup_text][0]
        except KeyError:
            return self._classify(cgroup_text)[0]

    def dirs_of(self, cgroup_text: bytes) -> CgroupDirs:
        """Where the own cgroup of a non-pod group is (`Classified.dirs`); () for a pod's
        process. Raises Malformed on bad text."""
        try:
            return self._groups[cgroup_text][1]
        except KeyError:
            return self._classify(cgroup_text)[1]

    def path_in(self, cgroup_text: bytes, hierarchy: str) -> bytes | None:
        """The host path of a process in one hierarchy (`host_path_in`), as bytes,
        remembered per cgroup file: asked for each quiet group's processes every pass.
        Raises Malformed on bad text."""
        key = (cgroup_text, hierarchy)
        try:
            return self._paths[key]
        except KeyError:
            pass
        make_room(self._paths)
        path = host_path_in(cgroup_text, hierarchy, self.namespace)
        found = self._paths[key] = None if path is None else os.fsencode(path)
        return found

    def _classify(self, cgroup_text: bytes) -> tuple[Group | None, CgroupDirs]:
        """Classify once per distinct cgroup file (processes of a group share its bytes)."""
        make_room(self._groups)
        classified = classify(cgroup_text, self.namespace)
        found = self._groups[cgroup_text] = (self._group_of(classified), classified.dirs)
        return found

    def _group_of(self, classified: Classified) -> Group | None:
        pod = classified.pod
        if pod is None:
            if self.pods_only:
                return None
            if classified.cgroup is None:
                return UNPLACED
            return Group("cgroup", (("cgroup", label_of(classified.cgroup)),))
        return self.pod_group(pod)

    def pod_group(self, pod: PodRef) -> Group:
        """The group of a pod (or, with `--per-container`, of one of its containers),
        remembered until the names or the QoS classes it is made from may change
        (`refresh`, `learn_qos`): asked for every pod on the node every pass."""
        group = self._pod_groups.get(pod)
        if group is None:
            make_room(self._pod_groups)
            group = self._pod_groups[pod] = self._make_pod_group(pod)
        return group

    def _make_pod_group(self, pod: PodRef) -> Group:
        info = self.names.pod(pod.uid)
        labels = [
            ("namespace", info.namespace if info else ""),
            ("pod", info.name if info else ""),
            ("uid", pod.uid),
            ("qos", self._qos.get(pod.uid) or pod.qos),
        ]
        if self.per_container:
            labels.append(("container", self.names.container(pod.container_id) or ""))
            labels.append(("container_id", pod.container_id))
        return Group("pod", tuple(labels))

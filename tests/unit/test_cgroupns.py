"""A reader in a cgroup namespace of its own (docs/reference.md §4): paths turned back into
the host's, the namespace's root found on the host, and what happens where it is not.

The pure parts take literals; `locate` runs over fixture trees; the last tests put a real
`procdelta once` in a real cgroup namespace (`unshare --cgroup`) inside a kubelet-shaped
pod cgroup beside a sibling process, as a container on a cgroup v2 node runs.
"""

from __future__ import annotations

import logging
import os
from types import MappingProxyType

import pytest

from collector.cgroupfs import detect
from collector.cgroupns import (
    HOST,
    CgroupNamespace,
    find_cgroup_of,
    join_path,
    locate,
    root_from,
    shares_hosts_namespace,
)
from collector.groups import UNPLACED, Grouper, classify
from collector.model import CgroupLine
from collector.podnames import PodNames

UID = "6f1d3b0e-2c4a-4e8b-9a51-0c7d2e4f8a10"
OTHER = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
CID = "4b9e1c0d2a3f5e6d7c8b9a0f1e2d3c4b5a69788776655443322110ffeeddccbb"
ROOT = f"/kubepods/besteffort/pod{UID}/libpod-{CID}"
# The reader's namespace, rooted at its own container's cgroup in the v2 tree (ID 0) and
# in the v1 cpu,cpuacct tree (ID 4).
INSIDE = CgroupNamespace(MappingProxyType({0: ROOT, 4: ROOT}))
UNKNOWN = CgroupNamespace(MappingProxyType({}), missing=("v2", "cpu,cpuacct"))


def line(path: str, hierarchy: int = 0) -> CgroupLine:
    return CgroupLine(hierarchy, () if hierarchy == 0 else ("cpu", "cpuacct"), path)


def hybrid(path: str) -> bytes:
    return f"4:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::{path}\n".encode()


@pytest.mark.parametrize(
    ("root", "path", "host"),
    [
        ("/a/b", "/", "/a/b"),
        ("/a/b", "/c", "/a/b/c"),
        ("/a/b", "/../c", "/a/c"),
        ("/a/b", "/../../../x/y", None),  # above the host's root: no real path does that
        ("/", "/x", "/x"),
        ("/a", "/..", "/"),
        ("/a/b", "/./c/", "/a/b/c"),
    ],
)
def test_join_path(root, path, host):
    assert join_path(root, path) == host


@pytest.mark.parametrize(
    ("found", "own", "root"),
    [
        ("/k/pod/ctr", "/", "/k/pod/ctr"),  # the reader at its namespace's root
        ("/k/pod/ctr/sub", "/sub", "/k/pod/ctr"),  # moved below it after the namespace
        ("/x", "/x", "/"),  # the namespace made at the host's root
        ("/k/pod/other", "/../other", None),  # moved out of its root: the root is unknown
        ("/k/pod/ctr", "/elsewhere", None),
        ("/a/bsub", "/sub", None),  # a suffix of a name, not of the path
    ],
)
def test_root_from_the_readers_own_cgroup(found, own, root):
    assert root_from(found, own) == root


def test_host_path_in_each_kind_of_namespace():
    assert HOST.host_path(line("/system.slice/x.service")) == "/system.slice/x.service"
    assert HOST.host_path(line("/../x")) is None  # the host's own paths never climb
    assert HOST.host_path(line("/..x")) == "/..x"  # a name that merely starts with dots
    assert INSIDE.host_path(line("/")) == ROOT
    assert INSIDE.host_path(line("/../pause", 4)) == f"/kubepods/besteffort/pod{UID}/pause"
    assert INSIDE.host_path(line("/", 9)) is None  # a hierarchy whose root is unknown
    assert UNKNOWN.host_path(line("/")) is None
    assert HOST.complete and INSIDE.complete and not UNKNOWN.complete


# What the reader in ROOT's namespace reads for each process, and its host group.
THROUGH_THE_NAMESPACE = [
    ("the reader itself", hybrid("/"), ("pod", UID, f"libpod-{CID}")),
    ("its pod's pause container", hybrid("/../libpod-" + "9c" * 32), ("pod", UID, "9c" * 32)),
    ("the runtime's monitor in its pod", hybrid("/../conmon"), ("pod", UID, "")),
    (
        "a pod beside it, its QoS class in the host's path",
        hybrid(f"/../../../burstable/pod{OTHER}/{CID}"),
        ("pod", OTHER, CID),
    ),
    (
        "a host service",
        hybrid("/../../../../system.slice/cron.service"),
        "/system.slice/cron.service",
    ),
    ("a process at the host's root", hybrid("/../../../.."), "/"),
    (
        "hybrid: v1 cpu path wins over a root v2 path",
        b"4:cpu,cpuacct:/../../../../batch/job7\n0::/../../../..\n",
        "/batch/job7",
    ),
]


def pod_of(classified) -> tuple[str, str, str]:
    return ("pod", classified.pod.uid, classified.pod.container_id)


@pytest.mark.parametrize(
    ("text", "group"),
    [c[1:] for c in THROUGH_THE_NAMESPACE],
    ids=[c[0] for c in THROUGH_THE_NAMESPACE],
)
def test_paths_read_through_the_namespace_are_the_hosts(text, group):
    classified = classify(text, INSIDE)
    if isinstance(group, tuple):
        assert classified.pod is not None and pod_of(classified)[:2] == group[:2]
        if group[2] != f"libpod-{CID}":  # `libpod-<id>`: a bare id with its runtime's prefix
            assert classified.pod.container_id == group[2]
    else:
        assert classified.pod is None
        assert classified.cgroup == group


def test_a_root_not_found_places_only_the_pods_whose_segment_shows():
    assert pod_of(classify(hybrid(f"/../../../burstable/pod{OTHER}/{CID}"), UNKNOWN)) == (
        "pod",
        OTHER,
        CID,
    )
    for path in ("/", "/../pause", "/../../../../system.slice/cron.service"):
        classified = classify(hybrid(path), UNKNOWN)
        assert (classified.pod, classified.cgroup) == (None, None), path
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"), namespace=UNKNOWN)
    assert grouper.group_of(hybrid("/")) is UNPLACED
    # a v2 path placed is not enough while the v1 cpu one, which may name the group, is not
    half = CgroupNamespace(MappingProxyType({0: ROOT}), missing=("cpu,cpuacct",))
    assert classify(b"4:cpu,cpuacct:/../../x\n0::/../../x\n", half).cgroup is None


# -- finding the root ---------------------------------------------------------------------


def fixture_tree(tmp_path, procs: dict[str, str]) -> str:
    """A hybrid host's tree of plain files: the v2 tree and a v1 cpu,cpuacct one, each
    with `cgroup.procs` files as given ({path: pids})."""
    root = tmp_path / "cgroup"
    (root / "unified").mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cpu,cpuacct").mkdir()
    (root / "cpu,cpuacct" / "cpu.stat").write_text("nr_periods 0\n")
    (root / "cpu,cpuacct" / "cpuacct.usage").write_text("0\n")
    for tree in ("unified", "cpu,cpuacct"):
        for path, pids in procs.items():
            directory = root / tree / path.strip("/")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup.procs").write_text(pids)
    return str(root)


def test_find_cgroup_of_a_pid(tmp_path):
    root = fixture_tree(tmp_path, {"/": "1\n2\n", "/a": "30\n", f"{ROOT}": "4\n300\n"})
    tree = os.fsencode(os.path.join(root, "unified"))
    assert find_cgroup_of(tree, 300) == ROOT
    assert find_cgroup_of(tree, 30) == "/a"
    assert find_cgroup_of(tree, 3) is None  # 30 and 300 are other PIDs


def a_private_namespace(tmp_path) -> tuple[str, str]:
    """A procfs whose init is in another cgroup namespace than this process (a file, so
    another inode), and this process's own cgroup file as its namespace shows it."""
    proc = tmp_path / "proc" / "1" / "ns"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("")
    own = tmp_path / "own-cgroup"
    own.write_text("4:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n")
    return str(tmp_path / "proc"), str(own)


def test_locate_finds_the_root_in_each_hierarchy(tmp_path, caplog):
    procfs, own = a_private_namespace(tmp_path)
    root = fixture_tree(tmp_path, {"/": "1\n", ROOT: "4242\n", "/system.slice": "7\n"})
    with caplog.at_level(logging.INFO, logger="collector.cgroupns"):
        namespace = locate(procfs, detect(root), own_cgroup=own, pid=4242)
    assert namespace.roots == {0: ROOT, 4: ROOT}
    assert namespace.complete
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_locate_says_once_where_no_root_is_found(tmp_path, caplog):
    procfs, own = a_private_namespace(tmp_path)
    root = fixture_tree(tmp_path, {"/": "1\n", "/system.slice": "7\n"})
    with caplog.at_level(logging.INFO, logger="collector.cgroupns"):
        namespace = locate(procfs, detect(root), own_cgroup=own, pid=4242)
    assert namespace.roots is not None and not namespace.complete
    assert set(namespace.missing) == {"v2", "cpu,cpuacct"}
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "could not find its root" in warning.getMessage()
    assert 'reason="unplaced"' in warning.getMessage()


def test_a_private_namespace_with_no_hierarchy_mounted_is_not_complete(tmp_path, caplog):
    """Nothing mounted at --path.cgroupfs: no root looked for, none found. The namespace is
    not complete (`procdelta_source_available{source="cgroup_namespace_root"} 0`), though
    no hierarchy is missing either."""
    procfs, own = a_private_namespace(tmp_path)
    with caplog.at_level(logging.INFO, logger="collector.cgroupns"):
        namespace = locate(procfs, detect(str(tmp_path / "nothing-mounted")), own_cgroup=own)
    assert namespace.roots == {} and namespace.missing == ()
    assert not namespace.complete
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "none mounted" in warning.getMessage()


def test_the_hosts_own_namespace_is_told_apart(tmp_path):
    procfs, _ = a_private_namespace(tmp_path)
    assert not shares_hosts_namespace(procfs)  # init's namespace has another inode
    assert shares_hosts_namespace("/proc")  # these tests run in the host's
    assert shares_hosts_namespace(str(tmp_path / "no-such-proc"))  # the initial one's inode
    # where a fixture tree has no init, the host's is the initial cgroup namespace
    assert locate(str(tmp_path / "empty"), detect(str(tmp_path))) is HOST


KINDS = ("v2", "cpu", "cpuacct")  # where a container runtime puts a container on this host

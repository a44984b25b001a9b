"""CgroupFS over fixture trees: which hierarchies it finds, how it reads a group, and
what it reads less (the bandwidth counters of a group whose usage did not move)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collector.cgroupfs import CgroupFS, Location, detect
from collector.cgroupguard import CgroupTracker
from collector.groups import PodRef
from collector.model import WHOLE_READ_PASSES, CgroupReading, Malformed
from collector.podcgroups import PodCgroups
from tests.cgroupfixture import (
    LAYOUTS,
    MAIN,
    CgroupReads,
    CgroupTree,
    pod_cgroups,
    psi,
    read_group,
    v1_stat,
    v2_stat,
)


@pytest.mark.parametrize(
    ("layout", "found", "has_psi"),
    [
        (MAIN, ["v2", "cpu", "cpuacct"], True),  # hybrid: unified/ beside cpu,cpuacct
        (LAYOUTS["v1"], ["cpu", "cpuacct"], False),
        (LAYOUTS["v2"], ["v2"], True),
    ],
)
def test_detect_the_hierarchies_by_their_files(layout, found, has_psi):
    tree = CgroupTree(layout)
    hierarchies = detect(str(tree.root))
    assert hierarchies.found() == found
    assert hierarchies.psi is has_psi


def test_detect_nothing_and_no_psi(tmp_path):
    assert detect(str(tmp_path)).found() == []
    (tmp_path / "cgroup.controllers").write_text("cpu\n")  # v2 without pressure files
    assert detect(str(tmp_path)).found() == ["v2"] and not detect(str(tmp_path)).psi


def test_pods_are_listed_in_every_hierarchy_with_their_qos():
    tree = CgroupTree(MAIN)
    fs = CgroupFS(str(tree.root))
    pods = pod_cgroups(fs, False)
    by_uid = {
        pod.uid: (pod, {loc.hierarchy for loc in locations}) for pod, locations in pods.items()
    }
    assert by_uid["0b3e7a52-9c1d-4f6e-8a2b-5d4c3b2a1f00"] == (
        PodRef("0b3e7a52-9c1d-4f6e-8a2b-5d4c3b2a1f00", "burstable", ""),
        {"cpu", "cpuacct"},  # one directory, both controllers (cpu,cpuacct)
    )
    assert by_uid["7c6d5e4f-3a2b-4c1d-9e8f-a0b1c2d3e4f5"][0].qos == "guaranteed"
    assert by_uid["7c6d5e4f-3a2b-4c1d-9e8f-a0b1c2d3e4f5"][1] == {"v2", "cpu", "cpuacct"}
    assert by_uid["9f8e7d6c5b4a39281706f5e4d3c2b1a0"][0].qos == "besteffort"  # static pod
    containers = pod_cgroups(fs, True)
    ids = {pod.container_id[:4] for pod in containers}
    assert {"a1a1", "e5e5", "b2b2", "d4d4", "c3c3"} <= ids
    assert not any(pod.container_id == "" for pod in containers)
    # CRI-O's conmon scope is the runtime's: no container of the pod
    assert len([p for p in containers if p.container_id.startswith("d4d4")]) == 1


def _pod(
    tmp_path: Path, stat: str, children: dict[str, str], whole_read_passes: int | None = None
) -> tuple[CgroupFS, Path]:
    """A pure v2 host with one pod whose cpu controller is on; its CgroupFS takes the
    shortcuts alone (no whole read every K passes) unless `whole_read_passes` says."""
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "cpu.pressure").write_text(psi(0))
    pod = tmp_path / "kubepods" / "podaaaaaaaa-0000-4000-8000-00000000000a"
    pod.mkdir(parents=True)
    (pod / "cpu.stat").write_text(stat)
    for name, text in children.items():
        (pod / name).mkdir(exist_ok=True)
        (pod / name / "cpu.stat").write_text(text)
    return CgroupFS(str(tmp_path), whole_read_passes=whole_read_passes), pod


def _write(path: Path, text: str) -> None:
    with open(path, "w") as out:  # in place, as the kernel rewrites it
        out.write(text)


def test_bandwidth_of_an_idle_group_is_carried_and_a_late_period_is_deferred_not_lost(tmp_path):
    """Usage unchanged: the container's cpu.stat is not read and its counters are carried
    over; the period timer's last idle period, counted after the last run, shows up at
    the next pass whose usage moved. The totals over the passes are exact."""
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {"c1": v2_stat(100, 10, 2, 500)})
    ((pod_ref, locations),) = pod_cgroups(fs, False).items()
    tracker = CgroupTracker()
    readings = []

    def read_pass():
        previous = readings[-1] if readings else None
        reading = read_group(fs, locations, previous)
        readings.append(reading)
        return tracker.advance({pod_ref: reading}).deltas.get(pod_ref)

    assert read_pass() is None  # first sighting
    _write(pod / "c1" / "cpu.stat", v2_stat(100, 11, 2, 500))  # one idle period, no usage
    idle = read_pass()
    assert idle.cgroup_cpu_nanos == 0 and idle.cpu_periods == 0  # deferred
    assert readings[-1].bandwidth is readings[-2].bandwidth  # carried, not read
    _write(pod / "cpu.stat", v2_stat(300, 0))
    _write(pod / "c1" / "cpu.stat", v2_stat(200, 13, 3, 700))
    ran = read_pass()
    assert ran.cgroup_cpu_nanos == 200_000
    assert (ran.cpu_periods, ran.cpu_throttled_periods, ran.cpu_throttled_nanos) == (
        3,  # the deferred idle period and the two of this interval
        1,
        200_000,
    )


def test_a_cgroup_made_anew_with_the_same_usage_has_its_bandwidth_read(tmp_path):
    """`_bandwidth_unchanged` needs the same cgroup, not only the same usage: a pod
    removed and made again under its path (a new inode) whose usage happens to read the
    same has its own counters, read, never the old cgroup's carried."""
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {"c1": v2_stat(100, 10, 2, 500)})
    ((_, locations),) = pod_cgroups(fs, False).items()
    first = read_group(fs, locations)
    for child in (pod / "c1", pod):
        for name in os.listdir(child):
            if not (child / name).is_dir():
                os.remove(child / name)
        os.rmdir(child)
    _pod(tmp_path, v2_stat(100, 0), {"c1": v2_stat(100, 4, 1, 300)})
    ((_, locations),) = pod_cgroups(fs, False).items()
    again = read_group(fs, locations, first)
    assert again.usage_ns == first.usage_ns and again.identity != first.identity
    assert [(b.periods, b.throttled_periods) for b in again.bandwidth] == [(0, 0), (4, 1)]


def test_what_a_shortcut_missed_is_read_within_k_passes(tmp_path, monkeypatch):
    """The bound of every cgroup shortcut: a group whose usage and whose parent's PSI
    stand still still has every file read once every K passes (`whole_read_due`, by the
    inode of its directory), so a count the shortcuts' facts missed — a period counted
    with no usage, a stall too short to move the parent — is late by at most K passes."""
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {"c1": v2_stat(100, 10, 2, 500)}, WHOLE_READ_PASSES)
    for resource in ("cpu", "memory", "io"):
        (pod / f"{resource}.pressure").write_text(psi(0))
        (pod.parent / f"{resource}.pressure").write_text(psi(0))
    ((pod_ref, locations),) = pod_cgroups(fs, False).items()
    reads = CgroupReads(monkeypatch)
    tracker = CgroupTracker()
    readings: list = []
    totals = {"cpu_periods": 0, "memory_pressure_waiting_nanos": 0}

    def read_pass() -> set[str]:
        reads.seen.clear()
        reading = read_group(fs, locations, readings[-1] if readings else None)
        fs.release_unused()
        readings.append(reading)
        delta = tracker.advance({pod_ref: reading}).deltas.get(pod_ref)
        for name in totals:
            totals[name] += getattr(delta, name, None) or 0
        return reads.names_in(pod) | {f"c1/{n}" for n in reads.names_in(pod / "c1")}

    read_pass()
    # missed by both facts: a period without usage, a stall below a still parent
    _write(pod / "c1" / "cpu.stat", v2_stat(100, 11, 2, 500))
    _write(pod / "memory.pressure", psi(3, 0))
    files = [read_pass() for _ in range(WHOLE_READ_PASSES)]
    whole = [n for n, names in enumerate(files) if "memory.pressure" in names]
    assert len(whole) == 1, files  # one pass in K, and no other
    assert files[whole[0]] >= {"cpu.stat", "memory.pressure", "c1/cpu.stat"}
    assert all(names == {"cpu.stat"} for n, names in enumerate(files) if n != whole[0])
    assert totals == {"cpu_periods": 1, "memory_pressure_waiting_nanos": 3000}


def test_a_group_read_whole_when_its_usage_moved(tmp_path):
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {"c1": v2_stat(100, 10, 2, 500)})
    ((_, locations),) = pod_cgroups(fs, False).items()
    first = read_group(fs, locations)
    _write(pod / "cpu.stat", v2_stat(101, 0))
    _write(pod / "c1" / "cpu.stat", v2_stat(101, 12, 2, 500))
    second = read_group(fs, locations, first)
    assert [b.periods for b in second.bandwidth] == [0, 12]


def test_a_quota_is_read_where_a_period_was_throttled_and_carried_elsewhere(tmp_path, monkeypatch):
    """A cgroup's quota serves only to turn its throttled time of an interval into wall
    time (collector/waits.py), so it is read where a period was throttled since the last
    reading, never for a cgroup that was not: v2 `cpu.max` ("max" is none)."""
    fs, pod = _pod(tmp_path, v2_stat(100, 10, 0, 0), {"c1": v2_stat(100, 10, 2, 500)})
    (pod / "cpu.max").write_text("max 100000\n")
    (pod / "c1" / "cpu.max").write_text("20000 100000\n")
    ((_, locations),) = pod_cgroups(fs, False).items()
    reads = CgroupReads(monkeypatch)
    first = read_group(fs, locations)
    assert "cpu.max" not in reads.names_in(pod)  # the pod never throttled: no quota read
    assert reads.names_in(pod / "c1") == {"cpu.stat", "cpu.max"}  # throttled before: read
    assert [(b.quota_ns, b.period_ns) for b in first.bandwidth] == [
        (None, None),
        (20_000_000, 100_000_000),
    ]
    reads.seen.clear()
    _write(pod / "cpu.stat", v2_stat(200, 12, 0, 0))
    _write(pod / "c1" / "cpu.stat", v2_stat(200, 12, 2, 500))  # ran, not throttled
    (pod / "c1" / "cpu.max").write_text("garbage\n")  # not read: carried
    second = read_group(fs, locations, first)
    assert "cpu.max" not in reads.names_in(pod / "c1")
    assert second.bandwidth[1].quota_ns == 20_000_000
    _write(pod / "cpu.stat", v2_stat(300, 13, 0, 0))
    _write(pod / "c1" / "cpu.stat", v2_stat(300, 13, 3, 600))  # throttled again: read
    (pod / "c1" / "cpu.max").write_text("50000 100000\n")
    assert read_group(fs, locations, second).bandwidth[1].quota_ns == 50_000_000
    _write(pod / "cpu.stat", v2_stat(400, 14, 0, 0))
    _write(pod / "c1" / "cpu.stat", v2_stat(400, 14, 4, 700))
    (pod / "c1" / "cpu.max").write_text("garbage\n")  # unreadable now: no quota, no error
    assert read_group(fs, locations, second).bandwidth[1].quota_ns is None


def test_a_cgroup_made_anew_with_the_same_throttled_count_has_its_quota_read(tmp_path):
    """The quota is carried only for the same cgroup (inode): one made anew under the same
    path, throttled as often as the old one was, has its own read."""
    from collector.model import Bandwidth

    fs, pod = _pod(tmp_path, v2_stat(100, 10, 2, 500), {})
    (pod / "cpu.max").write_text("20000 100000\n")
    ((_, locations),) = pod_cgroups(fs, False).items()
    reading = read_group(fs, locations)
    (own,) = reading.bandwidth
    old = Bandwidth(b"", own.inode + 1, own.periods, own.throttled_periods, own.throttled_ns,
                    90_000_000, 100_000_000)  # fmt: skip
    again = read_group(fs, locations, reading._replace(bandwidth=(old,), usage_ns=None))
    assert again.bandwidth[0].quota_ns == 20_000_000


def test_no_quota_is_none():
    from collector.parse import parse_cfs_quota, parse_cpu_max

    assert parse_cpu_max(b"max 100000\n") == (None, 100000)
    assert parse_cpu_max(b"20000 100000\n") == (20000, 100000)
    assert parse_cfs_quota(b"-1\n") is None and parse_cfs_quota(b"150000\n") == 150000
    for bad in (b"max\n", b"-5 100000\n", b"20000 x\n"):
        with pytest.raises(Malformed):
            parse_cpu_max(bad)


def test_a_v1_quota_is_read_from_its_two_files(tmp_path):
    tree = CgroupTree(LAYOUTS["v1"], str(tmp_path / "cg"))
    directory = tree.root / "cpu,cpuacct" / "system.slice" / "foo.service"
    (directory / "cpu.stat").write_text(v1_stat(10, 4, 40))
    (directory / "cpu.cfs_quota_us").write_text("150000\n")
    (directory / "cpu.cfs_period_us").write_text("100000\n")
    fs = CgroupFS(str(tree.root))
    where = [Location(h, b"/system.slice/foo.service", None, False) for h in ("cpu", "cpuacct")]
    (counters,) = read_group(fs, where).bandwidth
    assert (counters.quota_ns, counters.period_ns) == (150_000_000, 100_000_000)
    (directory / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert read_group(fs, where).bandwidth[0].quota_ns is None


def test_a_group_gone_before_it_is_read_is_not_an_error(tmp_path):
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {})
    ((_, locations),) = pod_cgroups(fs, False).items()
    for name in os.listdir(pod):
        os.unlink(pod / name)
    pod.rmdir()
    assert read_group(fs, locations) is None
    assert read_group(fs, [Location("v2", b"/system.slice/gone.service", None, False)]) is None


def test_v1_cgroup_with_no_bandwidth_file_has_no_bandwidth(tmp_path):
    tree = CgroupTree(LAYOUTS["v1"], str(tmp_path / "cg"))
    os.unlink(tree.root / "cpu,cpuacct" / "system.slice" / "foo.service" / "cpu.stat")
    fs = CgroupFS(str(tree.root))
    reading = read_group(
        fs, [Location(h, b"/system.slice/foo.service", None, False) for h in ("cpu", "cpuacct")]
    )
    assert reading.usage_ns == 10**9 and reading.bandwidth is None
    assert reading.pressure == (None, None, None)


def test_directories_are_held_while_read_and_let_go_after(tmp_path):
    tree = CgroupTree(MAIN, str(tmp_path / "cg"))
    fs = CgroupFS(str(tree.root))
    targets = {ref: locations for ref, locations in pod_cgroups(fs, False).items()}
    fs.read_groups(targets, {})
    fs.release_unused()
    held = dict(fs._held)
    assert held  # the pods' v2 directories (and the v1-only pod's cpuacct)
    for directory, (inode, fd) in held.items():
        assert os.fstat(fd).st_ino == inode == os.stat(directory).st_ino
    fs.read_groups({}, {})  # a pass that reads none of them
    fs.release_unused()
    assert not fs._held
    for _, fd in held.values():
        with pytest.raises(OSError):
            os.fstat(fd)


@pytest.mark.parametrize("by_group", [False, True])
def test_a_directory_made_anew_is_not_read_through_the_old_descriptor(tmp_path, by_group):
    """Nor through the old one's plan (`read_groups` keeps a group's plan while its
    locations, inodes included, are the same)."""
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {})

    def read() -> CgroupReading:
        ((_, locations),) = pod_cgroups(fs, False).items()
        if not by_group:
            return read_group(fs, locations)
        (reading,) = fs.read_groups({"pod": list(locations)}, {}).values()
        fs.release_unused()
        return reading

    assert read().usage_ns == read().usage_ns == 100_000
    os.rename(pod, tmp_path / "old")  # kept aside: the new directory gets another inode
    pod.mkdir()
    (pod / "cpu.stat").write_text(v2_stat(7, 0))
    reading = read()
    assert reading.usage_ns == 7_000
    assert reading.identity == (("v2", os.stat(pod).st_ino),)


def test_a_v1_pod_sums_the_bandwidth_of_every_cgroup_below_it(tmp_path):
    tree = CgroupTree(LAYOUTS["v1"], str(tmp_path / "cg"))
    deeper = tree.root / "cpu,cpuacct" / "kubepods" / "podaaaaaaaa-0000-4000-8000-00000000000a"
    (deeper / ("1c" * 32) / "nested").mkdir()
    (deeper / ("1c" * 32) / "nested" / "cpu.stat").write_text(v1_stat(4, 4, 40))
    fs = CgroupFS(str(tree.root))
    pods = pod_cgroups(fs, False)
    (locations,) = [loc for ref, loc in pods.items() if ref.uid.startswith("aaaa")]
    bandwidth = read_group(fs, locations).bandwidth
    assert sorted(b.path for b in bandwidth) == [
        b"",
        b"/" + ("1c" * 32).encode(),
        b"/" + ("1c" * 32).encode() + b"/nested",
        b"/" + ("9c" * 32).encode(),
    ]


def test_co_mounted_controllers_are_listed_once(tmp_path):
    """`cpu` and `cpuacct` linking to one `cpu,cpuacct` tree: one walk, both locations."""
    tree = CgroupTree(LAYOUTS["v1"], str(tmp_path / "cg"))
    listing = PodCgroups(detect(str(tree.root)))
    walked = []
    walk = listing._pod_dirs
    listing._pod_dirs = lambda root: walked.append(root) or walk(root)
    found = listing.pods(False)
    assert len(walked) == 1
    for locations in found.values():
        assert sorted(loc.hierarchy for loc in locations) == ["cpu", "cpuacct"]


@pytest.mark.parametrize("per_container", [False, True])
def test_every_listing_is_read_again_and_what_it_holds_made_again_where_it_changed(
    tmp_path, per_container
):
    """`pods` lists every directory every pass, and takes what a listing holds from the
    last pass only while the listing is the same: a pod or a container started, gone,
    or made anew under the same name (a new inode) shows at the next listing."""
    first, second = "a1" * 32, "b2" * 32
    fs, pod = _pod(tmp_path, v2_stat(100, 0), {first: v2_stat(1)})
    other = pod.parent / "podbbbbbbbb-0000-4000-8000-00000000000b"

    def listed() -> dict[tuple[str, str], int]:
        return {
            (ref.uid[:1], ref.container_id[:2]): location.inode
            for ref, locations in pod_cgroups(fs, per_container).items()
            for location in locations
        }

    def inode(path: Path) -> int:
        return os.stat(path).st_ino

    if not per_container:
        assert listed() == listed() == {("a", ""): inode(pod)}
        other.mkdir()
        assert listed() == {("a", ""): inode(pod), ("b", ""): inode(other)}
        os.rename(pod, tmp_path / "aside")  # kept: the new directory gets another inode
        pod.mkdir()
        assert listed() == {("a", ""): inode(pod), ("b", ""): inode(other)}
        other.rmdir()
        assert listed() == {("a", ""): inode(pod)}
        return
    assert listed() == listed() == {("a", "a1"): inode(pod / first)}
    (pod / second).mkdir()
    assert listed() == {("a", "a1"): inode(pod / first), ("a", "b2"): inode(pod / second)}
    os.rename(pod / first, tmp_path / "aside")
    (pod / first).mkdir()
    assert listed() == {("a", "a1"): inode(pod / first), ("a", "b2"): inode(pod / second)}
    (pod / second).rmdir()
    other.mkdir()
    (other / second).mkdir()
    assert listed() == {("a", "a1"): inode(pod / first), ("b", "b2"): inode(other / second)}


def _psi_host(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """A pure v2 host: `kubepods` (the parent) and two pods below it, every PSI file 0."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory io\n")
    parent = tmp_path / "kubepods"
    pods = {n: parent / f"pod{n * 8}-0000-4000-8000-00000000000{n}" for n in ("a", "b")}
    for directory in (tmp_path, parent, *pods.values()):
        directory.mkdir(exist_ok=True)
        (directory / "cpu.stat").write_text(v2_stat(100))
        for resource in ("cpu", "memory", "io"):
            (directory / f"{resource}.pressure").write_text(psi(0))
    return parent, pods


def test_pressure_below_a_parent_whose_totals_did_not_move_is_carried_not_read(
    tmp_path, monkeypatch
):
    """A parent's PSI totals cover its whole subtree (`pressure_unmoved`): while a
    resource's stand still there, its children's files are not read and their last
    readings stand; one that moved has every child's file of it read again."""
    parent, pods = _psi_host(tmp_path)
    fs = CgroupFS(str(tmp_path), whole_read_passes=None)  # the shortcut alone
    reads = CgroupReads(monkeypatch)
    readings: dict = {}

    def read_pass() -> dict:
        reads.seen.clear()
        targets = pod_cgroups(fs, False)
        got = fs.read_groups(targets, readings)
        fs.release_unused()
        readings.clear()
        readings.update(got)
        return {pod.uid[:1]: reading.pressure for pod, reading in got.items()}

    def truth() -> dict:  # a collector started now: reads every file (not counted)
        kept = list(reads.seen)
        fresh = CgroupFS(str(tmp_path))
        got = fresh.read_groups(pod_cgroups(fresh, False), {})
        reads.seen[:] = kept
        return {pod.uid[:1]: reading.pressure for pod, reading in got.items()}

    psi_files = {"cpu.pressure", "memory.pressure", "io.pressure"}
    first = read_pass()
    assert all(reads.names_in(pod) >= psi_files for pod in pods.values())
    assert reads.names_in(parent) == psi_files  # read first, for the next pass
    assert read_pass() == first == truth()
    assert all(reads.names_in(pod) == {"cpu.stat"} for pod in pods.values())

    # pod a waits for memory: its total and its parent's grow (the kernel adds both)
    _write(pods["a"] / "memory.pressure", psi(700, 300))
    _write(parent / "memory.pressure", psi(700, 300))
    got = read_pass()
    assert all(reads.names_in(pod) == {"cpu.stat", "memory.pressure"} for pod in pods.values())
    assert got["a"][1] == (700, 300) and got == truth()
    assert read_pass() == got and reads.names_in(pods["a"]) == {"cpu.stat"}

    # pod b made anew under its path (a new inode): read whole, its parent still or not
    for name in os.listdir(pods["b"]):
        os.remove(pods["b"] / name)
    os.rmdir(pods["b"])
    _psi_host(tmp_path)
    _write(pods["b"] / "io.pressure", psi(5, 0))
    got = read_pass()
    assert reads.names_in(pods["b"]) >= psi_files and got["b"][2] == (5, 0)
    assert got == truth()

    # the parent's files gone (PSI turned off there): no shortcut
    for resource in ("cpu", "memory", "io"):
        os.remove(parent / f"{resource}.pressure")
    read_pass()
    read_pass()
    assert all(reads.names_in(pod) >= psi_files for pod in pods.values())

"""The CPUs a group's running processes may use (collector/cpusets.py): CPU lists as the
kernel writes them, the union over the cgroups a group's processes ran in, v1's cpuset
hierarchy and v2's with the controller off below a point, and what the interval's split
makes of a group pinned to fewer CPUs than the node has."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.cgroupfs import detect
from collector.cpusets import Cpusets, cpu_set, format_cpu_list, parse_cpu_list
from collector.exposition import cpuset_members
from collector.groups import Group, Grouper
from collector.model import CgroupFields, CpuSet, Fields, Malformed, ProcessReading
from collector.podnames import PodNames
from collector.tracker import ProcessDelta
from collector.waits import NodeInterval, split_run_delay, with_waits
from tests.readings import process_reading

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        (b"0-3\n", [0, 1, 2, 3]),
        (b"0-1,4,6-7\n", [0, 1, 4, 6, 7]),
        (b"5", [5]),
        (b"\n", []),
        (b"63-64", [63, 64]),
    ],
)
def test_a_cpu_list_as_the_kernel_writes_it(text, cpus):
    mask = parse_cpu_list(text)
    assert [c for c in range(128) if mask >> c & 1] == cpus
    assert parse_cpu_list(format_cpu_list(mask).encode()) == mask


@pytest.mark.parametrize(
    "text", [b"a", b"1-", b"3-1", b"1,,2", b"-2", b"0-70000", b"9" * 5000, b"0-" + b"9" * 5000]
)
def test_a_malformed_cpu_list_is_refused(text):
    with pytest.raises(Malformed):
        parse_cpu_list(text)


@given(st.sets(st.integers(0, 255)))
def test_the_list_written_reads_back(cpus):
    mask = sum(1 << c for c in cpus)
    text = format_cpu_list(mask)
    assert parse_cpu_list(text.encode()) == mask
    assert ",," not in text and not text.startswith(",")


def test_a_set_is_all_where_it_is_the_nodes_whole_set():
    assert cpu_set(0b1111, 0b1111) == CpuSet("all", 4)
    assert cpu_set(0b0110, 0b1111) == CpuSet("1-2", 2)
    assert cpu_set(0b0110, None) == CpuSet("1-2", 2)


def reading(pid: int, cgroup: str) -> ProcessReading:
    return process_reading(pid=pid, cgroup=cgroup.encode(), threads=())


def delta(pid: int, cgroup: str, on_cpu: int) -> ProcessDelta:
    return ProcessDelta(reading(pid, cgroup), Fields(on_cpu_nanos=on_cpu), False)


def write(root: Path, path: str, name: str, text: str) -> None:
    directory = root / path.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)


POD = "kubepods/pod0b3e7a52-9c1d-4f6e-8a2b-5d4c3b2a1f00"


def test_a_group_may_use_the_cpus_of_the_cgroups_its_running_processes_ran_in(tmp_path):
    """v1's cpuset hierarchy: a pinned pod's app container on CPUs 2-3, its pause container
    on the shared pool (it never runs, so its set is not the pod's); a service on the
    reserved CPU 0; a process that did not run adds nothing."""
    root = tmp_path / "cgroup"
    write(root, "cpuset", "cpuset.effective_cpus", "0-7\n")
    write(root, f"cpuset/{POD}/app", "cpuset.effective_cpus", "2-3\n")
    write(root, f"cpuset/{POD}/pause", "cpuset.effective_cpus", "0-1,4-7\n")
    write(root, "cpuset/system.slice/agent.service", "cpuset.effective_cpus", "0\n")
    write(root, "cpu,cpuacct", "cpu.stat", "nr_periods 0\n")
    write(root, "cpu,cpuacct", "cpuacct.usage", "0\n")
    hierarchies = detect(str(root))
    assert hierarchies.cpuset == str(root / "cpuset").encode()
    grouper = Grouper(PodNames(str(tmp_path), str(tmp_path)))

    def cg(path: str) -> str:
        return f"4:cpuset:/{path}\n3:cpu,cpuacct:/{path}\n0::/\n"

    deltas = [
        delta(10, cg(f"{POD}/app"), 5 * S),
        delta(11, cg(f"{POD}/pause"), 0),
        delta(20, cg("system.slice/agent.service"), S),
        delta(30, cg("system.slice/idle.service"), 0),
    ]
    groups = {d.reading.pid: grouper.group_of(d.reading.cgroup) for d in deltas}
    cpusets = Cpusets(hierarchies)
    found = cpusets.of_groups(deltas, groups, grouper)
    assert {
        g.label_dict().get("pod", g.label_dict().get("cgroup")): m for g, m in found.items()
    } == {
        "": 0b1100,  # the pod, unnamed here: its app container's CPUs
        "/system.slice/agent.service": 0b1,
    }
    assert cpusets.node() == 0xFF


def test_on_v2_a_cgroup_without_the_controller_has_its_nearest_ancestors_set(tmp_path):
    root = tmp_path / "cgroup"
    write(root, "", "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root, "", "cpuset.cpus.effective", "0-3\n")
    write(root, "kubepods", "cpuset.cpus.effective", "1-3\n")
    write(root, f"{POD}/app", "cpu.stat", "usage_usec 1\n")  # no cpuset file below kubepods
    write(root, "system.slice/x.service", "cpu.stat", "usage_usec 1\n")  # nor here
    hierarchies = detect(str(root))
    grouper = Grouper(PodNames(str(tmp_path), str(tmp_path)))
    deltas = [delta(1, f"0::/{POD}/app\n", S), delta(2, "0::/system.slice/x.service\n", S)]
    groups = {d.reading.pid: grouper.group_of(d.reading.cgroup) for d in deltas}
    cpusets = Cpusets(hierarchies)
    found = {g.kind: m for g, m in cpusets.of_groups(deltas, groups, grouper).items()}
    assert found == {"pod": 0b1110, "cgroup": 0b1111}


def test_without_a_cpuset_hierarchy_no_group_has_a_set(tmp_path):
    root = tmp_path / "cgroup"
    write(root, "cpu", "cpu.stat", "nr_periods 0\n")
    cpusets = Cpusets(detect(str(root)))
    grouper = Grouper(PodNames(str(tmp_path), str(tmp_path)))
    deltas = [delta(1, "3:cpu:/a\n", S)]
    assert cpusets.of_groups(deltas, {1: grouper.group_of(b"3:cpu:/a\n")}, grouper) == {}
    assert cpusets.node() is None


def test_own_threads_are_measured_against_the_cpus_the_group_may_use():
    """A Guaranteed pod of four busy threads pinned to two CPUs of an eight-CPU node, on
    the interval's averages: each thread runs half the time, two seconds a second wait.
    Against its two CPUs the wait is its own threads'; against the node's eight it was its
    neighbours' (the node busy elsewhere)."""
    fields = Fields(on_cpu_nanos=2 * S, run_delay_nanos=2 * S)
    node = NodeInterval(cpus=8, interval_ns=S, busy_ns=7 * S)
    assert split_run_delay(fields, CgroupFields(cgroup_cpu_nanos=2 * S), node, 2) == (0, 2 * S, 0)
    assert split_run_delay(fields, CgroupFields(cgroup_cpu_nanos=2 * S), node) == (0, 0, 2 * S)
    pod = Group("pod", (("pod", "pinned"),))
    split = with_waits(
        {pod: fields},
        {pod: CgroupFields(cgroup_cpu_nanos=2 * S, cpu_throttled_nanos=0)},
        {},
        node,
        {pod: CpuSet("2-3", 2)},
    )
    assert split[pod].run_delay_own_threads_nanos == 2 * S
    assert split[pod].run_delay_neighbours_nanos == 0


def test_each_list_but_all_has_a_series_for_each_of_its_cpus():
    """The static CPU manager's default: the reserved CPUs 0-1 stay in the shared pool
    0-1,14-15, a daemon runs on 0-1, a pod has 2-13 of its own. Joined on `cpu`, the
    daemon's list and the pool's share CPUs 0 and 1, the pinned pod's shares none; `all`
    (every CPU) has no series, and a list two groups show is written once."""
    sets = {
        Group("pod", (("pod", "api"),)): CpuSet("0-1,14-15", 4),
        Group("pod", (("pod", "web"),)): CpuSet("0-1,14-15", 4),
        Group("cgroup", (("cgroup", "/agent.service"),)): CpuSet("0-1", 2),
        Group("pod", (("pod", "ml"),)): CpuSet("2-13", 12),
        Group("pod", (("pod", "any"),)): CpuSet("all", 16),
    }
    family = cpuset_members(sets)
    assert family.name == "procdelta_cpuset_member"
    cpus: dict[str, set[int]] = {}
    for suffix, labels, value in family.samples:
        assert (suffix, value, [name for name, _ in labels]) == ("", 1, ["cpus", "cpu"])
        cpus.setdefault(labels[0][1], set()).add(int(labels[1][1]))
    assert cpus == {"0-1": {0, 1}, "0-1,14-15": {0, 1, 14, 15}, "2-13": set(range(2, 14))}
    assert len(family.samples) == 2 + 4 + 12
    assert cpus["0-1"] & cpus["0-1,14-15"] == {0, 1}
    assert not cpus["2-13"] & (cpus["0-1"] | cpus["0-1,14-15"])
    assert cpuset_members({Group("pod", (("pod", "any"),)): CpuSet("all", 16)}).samples == ()

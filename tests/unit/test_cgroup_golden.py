"""The cgroup fields (docs/reference.md §7) on one small node per kind of host, through two passes.

Each layout of tests/cgroupfixture.py (pure v1 with the cgroupfs driver, pure v2 with the
systemd driver, paths seen from another cgroup namespace, kind's nested kubelet; the
hybrid host is the main fixture's, in tests/unit/test_golden.py) is compared whole with
`tests/golden/cgroup-<layout>.json`, and its key numbers are checked against values
derived by hand from the layout. Rewrite the golden files after an intended change with
`python -m pytest tests/unit/test_cgroup_golden.py --update-golden`, and review the diff.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from collector import output
from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS
from collector.cgroupns import HOST, CgroupNamespace
from collector.engine import Engine, PassResult
from collector.groups import Grouper
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker
from tests.cgroupfixture import LAYOUTS, CgroupTree, Layout, write_proc
from tests.fixturetree import SEC, ScriptedClock
from tests.unit.test_golden import check_golden


def two_passes(layout: Layout, tmp_path: Path, per_container: bool = False) -> PassResult:
    proc = tmp_path / "proc"
    write_proc(proc, layout.processes, 0)
    pods, containers = tmp_path / "pods", tmp_path / "containers"
    containers.mkdir()
    for name in layout.pod_logs:
        (pods / name).mkdir(parents=True)
    for name in layout.container_logs:
        (containers / name).touch()
    tree = CgroupTree(layout, str(tmp_path / "cgroup"))
    clock = ScriptedClock()
    namespace = HOST
    if layout.namespace_root == "?":  # a namespace whose root was not found
        namespace = CgroupNamespace(MappingProxyType({}), missing=("v2",))
    elif layout.namespace_root is not None:  # the v2 hierarchy's, ID 0
        namespace = CgroupNamespace(MappingProxyType({0: layout.namespace_root}))
    engine = Engine(
        Reader(ProcFS(str(proc)), clock=clock, page_size=4096),
        Tracker(hz=100),
        Grouper(
            PodNames(str(pods), str(containers)),
            per_container=per_container,
            namespace=namespace,
        ),
        Totals(),
        wall_clock=lambda: 1_700_000_000.0,
        timer=lambda: 0.0,
        cgroupfs=CgroupFS(str(tree.root)),
    )
    engine.run_pass()
    write_proc(proc, layout.processes, 1)
    tree.next_pass()
    clock.now = 1010 * SEC
    return engine.run_pass()


def by_name(result: PassResult, per_container: bool = False) -> dict[str, object]:
    named = {}
    for group, cgroup in result.cgroup_intervals.items():
        labels = group.label_dict()
        name = labels.get("pod") or labels.get("cgroup")
        if per_container:
            name = f"{name}/{labels.get('container') or labels.get('container_id', '')[:4]}"
        named[name] = cgroup
    return named


@pytest.mark.parametrize(
    ("layout", "per_container"),
    [("v1", False), ("v1", True), ("v2", False), ("cgroupns", False), ("kind", False)],
)
def test_layout_golden(layout, per_container, tmp_path, update_golden):
    result = two_passes(LAYOUTS[layout], tmp_path, per_container)
    suffix = "-per-container" if per_container else ""
    check_golden(f"cgroup-{layout}{suffix}.json", output.as_json(result) + "\n", update_golden)


def test_v1_pod_sums_its_own_and_its_containers_quota_and_counts_a_new_container_whole(
    tmp_path,
):
    result = two_passes(LAYOUTS["v1"], tmp_path)
    named = by_name(result)
    api = named["api-0"]
    assert api.cgroup_cpu_nanos == 25 * 10**8  # cpuacct.usage
    # pod 50 + container 50 + the new container's 5 (made since the last pass: whole)
    assert (api.cpu_periods, api.cpu_throttled_periods) == (105, 25 + 30 + 5)
    assert api.cpu_throttled_nanos == (25 + 30 + 5) * 10**8
    assert api.cpu_pressure_waiting_nanos is None  # v1 has no PSI
    assert named["job-x"].cgroup_cpu_nanos == 7 * 10**8  # no process seen, still read
    assert named["/system.slice/foo.service"].cgroup_cpu_nanos == 25 * 10**7
    assert named["/system.slice/foo.service"].cpu_periods == 0
    qos = {g.label_dict().get("pod"): g.label_dict().get("qos") for g in result.cgroup_intervals}
    assert qos["api-0"] == "guaranteed" and qos["job-x"] == "besteffort"


def test_v1_per_container_groups_are_the_container_cgroups(tmp_path):
    named = by_name(two_passes(LAYOUTS["v1"], tmp_path, per_container=True), True)
    assert named["api-0/server"].cpu_periods == 50  # its own quota, not the pod's
    assert named["api-0/server"].cgroup_cpu_nanos == 2 * 10**9
    assert "api-0/9c9c" in named  # the pause container is a container too
    assert not any(name.startswith("job-x") for name in named)  # no container cgroup


def test_v2_bandwidth_in_usec_and_a_recreated_service(tmp_path):
    result = two_passes(LAYOUTS["v2"], tmp_path)
    named = by_name(result)
    worker = named["worker-1"]
    assert worker.cgroup_cpu_nanos == SEC
    assert (worker.cpu_periods, worker.cpu_throttled_periods) == (100, 90)
    assert worker.cpu_throttled_nanos == 8 * SEC  # throttled_usec * 1000
    assert worker.cpu_pressure_waiting_nanos == worker.cpu_pressure_stalled_nanos == 8 * SEC
    assert "/system.slice/foo.service" not in named  # made anew: no delta
    assert result.dropped_cgroups["recreated"] == 1
    assert named["/init.scope"].cgroup_cpu_nanos == 2 * 10**6


def test_paths_from_another_cgroup_namespace_find_their_cgroups(tmp_path):
    result = two_passes(LAYOUTS["cgroupns"], tmp_path)
    named = by_name(result)
    assert named["a-0"].cgroup_cpu_nanos == 3 * SEC
    assert named["a-0"].cpu_pressure_waiting_nanos == 10**8
    assert named["b-0"].cgroup_cpu_nanos == SEC
    assert named["/system.slice/foo.service"].cgroup_cpu_nanos == 4 * 10**8
    # the QoS class comes from the pod's directory, which the namespaced path had lost;
    # the process sums and the cgroup fields land on the same group
    groups = {g.label_dict().get("pod"): g for g in result.cgroup_intervals}
    assert groups["a-0"].label_dict()["qos"] == "burstable"
    assert groups["b-0"].label_dict()["qos"] == "guaranteed"
    assert set(result.intervals) == set(result.cgroup_intervals)
    # the reader's own pod holds the reader (`/`) and its pause container (`/../<id>`)
    own = groups["procdelta-x1"]
    assert result.footprints[own].processes == 2
    assert result.intervals[own].on_cpu_nanos == 5 * 10**8
    assert result.cgroup_intervals[own].cgroup_cpu_nanos == 5 * 10**8
    assert result.dropped["unplaced"] == 0


def test_a_namespace_whose_root_is_unknown_places_only_what_its_paths_tell(tmp_path):
    """The same node read through a namespace whose root was not found: the pods whose
    segment shows in their paths are still theirs; the reader, its pause container and
    the service are counted as unplaced, never labelled."""
    layout = LAYOUTS["cgroupns"]
    unknown = Layout(
        layout.passes, processes=layout.processes, pod_logs=layout.pod_logs, namespace_root="?"
    )
    result = two_passes(unknown, tmp_path)
    named = {g.label_dict().get("pod") or g.label_dict().get("cgroup") for g in result.intervals}
    assert named == {"a-0", "b-0"}
    assert result.dropped["unplaced"] == 3  # the reader, its pause container, the service
    # the reader's pod is still read from its directory: its cgroup fields are the kernel's
    assert "procdelta-x1" in by_name(result)


def test_kind_nested_kubelet(tmp_path):
    result = two_passes(LAYOUTS["kind"], tmp_path)
    (group,) = result.cgroup_intervals
    assert group.label_dict()["qos"] == "besteffort"
    app = result.cgroup_intervals[group]
    assert app.cgroup_cpu_nanos == 2 * SEC
    assert app.memory_pressure_waiting_nanos == 3 * 10**8
    assert app.memory_pressure_stalled_nanos == 10**8
    assert result.intervals[group].on_cpu_nanos == 2 * SEC

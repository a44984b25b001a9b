"""Kernel truth: real processes in real kubelet-shaped cgroups, read by procdelta.

What fixtures cannot prove: that the kernel's numbers come out right. Needs root and
writable cgroup hierarchies (v2 and the v1 `cpu` controller); fails without them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid

import pytest

from collector.cli import Options, build_engine
from collector.engine import PassResult
from collector.model import Fields
from tests.cgroups import Workload, cgroup, hierarchy

pytestmark = pytest.mark.kernel

HZ = os.sysconf("SC_CLK_TCK")
TICK_NS = 1_000_000_000 // HZ
MiB = 1 << 20


def pod_layout(driver: str, uid: str, cid: str) -> tuple[str, str]:
    """(hierarchy, path) of a burstable container cgroup as kubelet lays it out."""
    if driver == "systemd-v2":
        slice_uid = uid.replace("-", "_")
        return "v2", (
            "kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{cid}.scope"
        )
    return "cpu", f"kubepods/burstable/pod{uid}/{cid}"


@pytest.fixture
def pod(tmp_path, request):
    """A pod's cgroup (layout by `request.param`) and kubelet's log trees naming it."""
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    (tmp_path / "pods" / f"truth_busy-pod_{uid}").mkdir(parents=True)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"busy-pod_truth_worker-{cid}.log").touch()
    kind, path = pod_layout(request.param, uid, cid)
    # Start from the top of the layout so that every directory we create is removed.
    with cgroup(kind, path) as cgroup_path:
        yield {
            "uid": uid,
            "cid": cid,
            "cgroup": cgroup_path,
            "options": Options(
                procfs="/proc",
                pod_logs=str(tmp_path / "pods"),
                container_logs=str(tmp_path / "containers"),
                per_container=True,
                pods_only=True,
            ),
        }


def pod_interval(result: PassResult, uid: str) -> tuple[dict[str, str], Fields]:
    matches = [
        (g.label_dict(), f) for g, f in result.intervals.items() if g.label_dict()["uid"] == uid
    ]
    assert len(matches) == 1, f"pod {uid} not found once in {list(result.intervals)}"
    return matches[0]


@pytest.mark.parametrize("pod", ["systemd-v2", "cgroupfs-v1"], indirect=True)
def test_busy_and_sleeping_threads(pod):
    with Workload(pod["cgroup"], "--busy", "4", "--sleepers", "2") as work:
        engine = build_engine(pod["options"])
        engine.run_pass()
        sleeps_before = int(work.ask("count"))
        time.sleep(2.0)
        sleeps_after = int(work.ask("count"))
        result = engine.run_pass()

    labels, fields = pod_interval(result, pod["uid"])
    assert labels == {
        "namespace": "truth",
        "pod": "busy-pod",
        "uid": pod["uid"],
        "qos": "burstable",
        "container": "worker",
        "container_id": pod["cid"],
    }
    assert fields.processes == 1
    cpu_ticks = fields.cpu_user_nanos + fields.cpu_system_nanos
    print(
        f"\non_cpu={fields.on_cpu_nanos} user+system={cpu_ticks} "
        f"diff={fields.on_cpu_nanos - cpu_ticks} observed={fields.observed_nanos} "
        f"run_delay={fields.run_delay_nanos} vol={fields.voluntary_switches} "
        f"invol={fields.nonvoluntary_switches} sleeps={sleeps_after - sleeps_before}"
    )
    # Four busy threads on this machine keep its cores busy for ~2 s.
    assert fields.on_cpu_nanos > 1.5e9
    # utime + stime are the kernel's sum_exec_runtime cut to ticks at each reading, and the
    # busy threads run on between the `stat` read and their `schedstat` reads (~0.1 ms per
    # thread, on every core): a few ticks at most over the interval.
    assert abs(fields.on_cpu_nanos - cpu_ticks) <= 4 * TICK_NS
    # Each 1 ms sleep is a voluntary switch of a non-leader thread, all inside the interval.
    assert sleeps_after - sleeps_before > 200
    assert fields.voluntary_switches >= sleeps_after - sleeps_before
    # Four runnable threads on two cores wait for a CPU.
    assert fields.run_delay_nanos > 0.1e9


def _disk_directory() -> str:
    """A directory on a block-device file system, so that write_bytes means bytes to storage."""
    for candidate in ("/var/tmp", tempfile.gettempdir(), os.getcwd()):
        if os.major(os.stat(candidate).st_dev) != 0:
            return candidate
    raise AssertionError("no directory on a real disk to write to")


@pytest.mark.parametrize("pod", ["systemd-v2"], indirect=True)
def test_reaped_child_bytes_counted_once(pod):
    directory = tempfile.mkdtemp(dir=_disk_directory(), prefix="procdelta-test-")
    target = os.path.join(directory, "data")
    try:
        with Workload(pod["cgroup"]) as work:
            child = int(work.ask("fork"))
            engine = build_engine(pod["options"])
            engine.run_pass()
            assert work.ask(f"write {target} {8 * MiB}") == "written"
            parent_io_before = _proc_io_write_bytes(work.pid)
            second = engine.run_pass()
            assert work.ask("reap") == "reaped"
            parent_io_after = _proc_io_write_bytes(work.pid)
            third = engine.run_pass()
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)

    _, while_alive = pod_interval(second, pod["uid"])
    _, after_reap = pod_interval(third, pod["uid"])
    print(
        f"\nchild {child}: interval with the write {while_alive.write_bytes} B, "
        f"interval of the reap {after_reap.write_bytes} B; the parent's /proc/<pid>/io "
        f"grew by {parent_io_after - parent_io_before} B at the reap"
    )
    assert while_alive.processes == 2
    assert 8 * MiB <= while_alive.write_bytes < 9 * MiB
    # The reap folds the child's bytes into the parent's /proc/<pid>/io: reading that file
    # would count them a second time. The per-thread files do not.
    assert parent_io_after - parent_io_before >= 8 * MiB
    assert after_reap.write_bytes < MiB
    assert while_alive.write_bytes + after_reap.write_bytes < 9 * MiB


def _proc_io_write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as io:
        for line in io:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes line")


@pytest.mark.parametrize("kind", ["v2", "cpu"])
def test_a_parent_two_tests_share_is_removed_by_the_last_one_out(kind):
    """Test runs side by side (the mutation runner's jobs) make the same parents: the one
    that made a parent may leave first, while the other's cgroup is still in it. The
    parent goes when the last one leaves; a directory no test made is never removed."""
    root = hierarchy(kind)
    outer = f"procdelta-shared-{uuid.uuid4().hex[:8]}"
    os.mkdir(os.path.join(root, outer))  # made here, not by `cgroup`: it must stay
    try:
        first = cgroup(kind, f"{outer}/parent/first")
        first_path = first.__enter__()
        with cgroup(kind, f"{outer}/parent/second") as second_path:
            first.__exit__(None, None, None)  # the maker of the parent leaves first
            assert not os.path.exists(first_path)
            assert os.path.isdir(second_path)
        assert not os.path.exists(os.path.join(root, outer, "parent"))
        assert os.path.isdir(os.path.join(root, outer))
    finally:
        for leftover in ("parent/second", "parent/first", "parent", ""):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(root, outer, leftover))

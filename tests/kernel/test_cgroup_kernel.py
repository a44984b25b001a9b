"""Kernel truth for the cgroup fields (docs/reference.md §7): real pods in real
kubelet-shaped cgroups.

The situations that made the process sums alone mislead, each against the kernel's own
files read by the test right after the collector's pass (the pass reads the cgroups at
its end, so the two readings are microseconds apart):

* a pod throttled by its own CPU quota: its run delay is its throttled time;
* a pod of short-lived processes: its cgroup's CPU is many times its sums' on-CPU, and
  is exported even when no process of it lived through a pass;
* a steady pod of one long-lived busy process: the two agree;
* a pod contending for one CPU on cgroup v2: its CPU pressure;
* PSI files under a parent whose totals stood still: not read, and their carried totals
  the kernel's; a stall below: read.

Needs root and writable v1 `cpu`/`cpuacct` and v2 hierarchies (this project's machines
are hybrid hosts); fails without them.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest

from collector.engine import Engine, PassResult
from collector.model import CgroupFields, CpuSet, Fields
from collector.parse import parse_flat_keyed, parse_pressure
from collector.passloop import PassLoop
from collector.wiring import Options, build_engine
from tests.cgroupfixture import CgroupReads
from tests.cgroups import Workload, cgroups, enter, hierarchy
from tests.machine import lay_out

pytestmark = pytest.mark.kernel

T = TypeVar("T")
HYBRID = ("cpu", "cpuacct", "v2")  # where a runtime puts a container on this host
INTERVAL = 3.0


def read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


class Pod:
    """A burstable pod and one container cgroup in it, cgroupfs-driver paths, in each of
    `kinds`; kubelet's log trees naming it; the options of a collector that sees it."""

    def __init__(self, tmp_path, name: str, kinds=HYBRID):
        self.uid = str(uuid.uuid4())
        self.cid = uuid.uuid4().hex * 2
        self.pod_path = f"kubepods/burstable/pod{self.uid}"
        self.path = f"{self.pod_path}/{self.cid}"
        self.kinds = kinds
        (tmp_path / "pods" / f"truth_{name}_{self.uid}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "containers").mkdir(exist_ok=True)
        self.options = Options(
            procfs="/proc",
            pod_logs=str(tmp_path / "pods"),
            container_logs=str(tmp_path / "containers"),
            per_container=False,
            pods_only=True,
        )

    def __enter__(self) -> Pod:
        self._made = cgroups(self.kinds, self.path)
        self.dirs = self._made.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._made.__exit__(*exc)

    def own(self, kind: str, name: str) -> bytes:
        """A file of the pod's own cgroup (not the container's)."""
        return read(os.path.join(hierarchy(kind), self.pod_path, name))

    def interval(self, result: PassResult) -> tuple[Fields | None, CgroupFields | None]:
        def mine(mapping):
            found = [v for g, v in mapping.items() if g.label_dict().get("uid") == self.uid]
            assert len(found) <= 1
            return found[0] if found else None

        return mine(result.intervals), mine(result.cgroup_intervals)


def measured_interval(pod: Pod, kernel: Callable[[], T], settle: float = 0.3):
    """Two passes `INTERVAL` apart, the kernel's own counter read right after each:
    (the second pass's result, the counter after the first, after the second)."""
    engine = build_engine(pod.options)
    time.sleep(settle)
    engine.run_pass()
    before = kernel()
    time.sleep(INTERVAL)
    result = engine.run_pass()
    return result, before, kernel()


def v1_throttling(pod: Pod) -> tuple[int, int, int]:
    """(periods, throttled periods, throttled ns) of the pod's cgroup and its container's."""
    totals = [0, 0, 0]
    for path in (pod.pod_path, pod.path):
        stat = parse_flat_keyed(read(os.path.join(hierarchy("cpu"), path, "cpu.stat")))
        for index, key in enumerate((b"nr_periods", b"nr_throttled", b"throttled_time")):
            totals[index] += stat[key]
    return totals[0], totals[1], totals[2]


def v2_usage_ns(pod: Pod) -> int:
    return parse_flat_keyed(pod.own("v2", "cpu.stat"))[b"usage_usec"] * 1000


def close(value: int, reference: int, tolerance: float) -> bool:
    return abs(value - reference) <= tolerance * reference


@pytest.mark.cpu_shares
def test_throttled_pod_run_delay_is_its_own_quota(tmp_path):
    lay_out()
    with Pod(tmp_path, "throttled") as pod:
        # a 10% quota on the container, as kubelet sets a CPU limit of 100m
        with open(os.path.join(pod.dirs["cpu"], "cpu.cfs_quota_us"), "w") as quota:
            quota.write("10000")
        with Workload(list(pod.dirs.values()), "--busy", "1"):
            result, before, after = measured_interval(pod, lambda: v1_throttling(pod), 0.5)
    fields, cgroup = pod.interval(result)
    assert fields is not None and cgroup is not None
    periods, throttled, throttled_ns = (a - b for a, b in zip(after, before, strict=True))
    print(
        f"\nthrottled pod over {INTERVAL:g} s: exported on_cpu {fields.on_cpu_nanos / 1e9:.3f} s, "
        f"run_delay {fields.run_delay_nanos / 1e9:.3f} s, cpu_throttled_nanos "
        f"{cgroup.cpu_throttled_nanos / 1e9:.3f} s, periods {cgroup.cpu_throttled_periods}/"
        f"{cgroup.cpu_periods}; kernel cpu.stat: throttled_time {throttled_ns / 1e9:.3f} s, "
        f"{throttled}/{periods}"
    )
    assert cgroup.cpu_throttled_periods > 0
    assert cgroup.cpu_throttled_periods == pytest.approx(throttled, abs=1)
    assert cgroup.cpu_periods == pytest.approx(periods, abs=1)
    assert close(cgroup.cpu_throttled_nanos, throttled_ns, 0.05), (cgroup, throttled_ns)
    # one runnable thread: the time it waited for a CPU is the time its quota held it
    assert close(cgroup.cpu_throttled_nanos, fields.run_delay_nanos, 0.15), (cgroup, fields)
    assert fields.run_delay_nanos > 5 * fields.on_cpu_nanos  # what looked like starvation
    assert cgroup.cpu_throttled_periods > 0.8 * cgroup.cpu_periods


def short_lived(paths: list[str], stop: threading.Event, between: threading.Event | None):
    """Back-to-back short CPU-bound processes (awk, ~tens of ms each) in the cgroups; with
    `between` set, none is started while it is clear (passes run then)."""
    work = "awk 'BEGIN { for (i = 0; i < 300000; i++) x += i }'"
    while not stop.is_set():
        if between is not None and not between.is_set():
            time.sleep(0.01)
            continue
        subprocess.run(["sh", "-c", f"{enter(paths)} && exec {work}"], check=True)


def test_short_lived_pod_shows_its_cpu_through_its_cgroup(tmp_path):
    """A shell running short children back to back: the sums see the shell and a few
    children; the cgroup sees every child."""
    with Pod(tmp_path, "short-lived") as pod:
        work = "awk 'BEGIN { for (i = 0; i < 300000; i++) x += i }'"
        shell = subprocess.Popen(
            ["sh", "-c", f"{enter(list(pod.dirs.values()))} && while :; do {work}; done"]
        )
        try:
            result, before, after = measured_interval(pod, lambda: v2_usage_ns(pod))
        finally:
            shell.kill()
            shell.wait()
    fields, cgroup = pod.interval(result)
    assert cgroup is not None
    print(
        f"\nshort-lived pod over {INTERVAL:g} s: exported on_cpu "
        f"{(fields.on_cpu_nanos if fields else 0) / 1e9:.3f} s, cgroup_cpu_nanos "
        f"{cgroup.cgroup_cpu_nanos / 1e9:.3f} s; kernel cpu.stat usage_usec "
        f"{(after - before) / 1e9:.3f} s"
    )
    assert close(cgroup.cgroup_cpu_nanos, after - before, 0.05), (cgroup, after - before)
    assert cgroup.cgroup_cpu_nanos > 0.5e9 * INTERVAL  # the children ran most of the time
    on_cpu = fields.on_cpu_nanos if fields else 0
    assert cgroup.cgroup_cpu_nanos >= 5 * on_cpu, (cgroup.cgroup_cpu_nanos, on_cpu)


def test_pod_with_no_process_alive_at_either_pass_still_exports_its_cpu(tmp_path):
    with Pod(tmp_path, "jobs") as pod:
        stop, running = threading.Event(), threading.Event()
        spawner = threading.Thread(
            target=short_lived, args=(list(pod.dirs.values()), stop, running), daemon=True
        )
        spawner.start()
        try:
            engine = build_engine(pod.options)
            loop = PassLoop(engine, INTERVAL)
            loop.run_pass()
            before = v2_usage_ns(pod)
            running.set()
            time.sleep(INTERVAL)
            running.clear()
            time.sleep(0.5)  # the last child has exited: no process of the pod is left
            assert not read(os.path.join(pod.dirs["v2"], "cgroup.procs")).split()
            result = loop.run_pass()
            after = v2_usage_ns(pod)
        finally:
            stop.set()
            running.set()
            spawner.join(10)
    fields, cgroup = pod.interval(result)
    assert fields is None  # no process of the pod was seen by a pass
    assert cgroup is not None and cgroup.cgroup_cpu_nanos > 0.5e9
    assert close(cgroup.cgroup_cpu_nanos, after - before, 0.05)
    page = loop.snapshot().text.decode()
    series = [line for line in page.splitlines() if f'uid="{pod.uid}"' in line]
    assert any(line.startswith("procdelta_interval_cgroup_cpu_nanos{") for line in series)
    assert any(line.startswith("procdelta_cgroup_cpu_nanos_total{") for line in series)
    assert not any(line.startswith("procdelta_interval_on_cpu_nanos{") for line in series)


@pytest.mark.cpu_shares
def test_steady_pod_sums_agree_with_its_cgroup(tmp_path):
    lay_out()
    with Pod(tmp_path, "steady") as pod, Workload(list(pod.dirs.values()), "--busy", "2"):
        result, _, _ = measured_interval(pod, lambda: None)
    fields, cgroup = pod.interval(result)
    assert fields is not None and cgroup is not None
    coverage = fields.on_cpu_nanos / cgroup.cgroup_cpu_nanos
    print(
        f"\nsteady pod over {INTERVAL:g} s: exported on_cpu {fields.on_cpu_nanos / 1e9:.3f} s, "
        f"cgroup_cpu_nanos {cgroup.cgroup_cpu_nanos / 1e9:.3f} s: coverage {coverage:.3f}"
    )
    assert 0.95 <= coverage <= 1.02, (fields.on_cpu_nanos, cgroup.cgroup_cpu_nanos)
    assert cgroup.cpu_throttled_periods == 0  # no quota, no throttling


@pytest.mark.cpu_shares
def test_v2_pod_contending_for_one_cpu_shows_cpu_pressure(tmp_path):
    lay_out()
    with Pod(tmp_path, "contended", kinds=("v2",)) as pod:
        paths = [pod.dirs["v2"]]
        with (
            Workload(paths, "--busy", "1", "--cpu", "0"),
            Workload(paths, "--busy", "1", "--cpu", "0"),
        ):
            result, before, after = measured_interval(
                pod, lambda: parse_pressure(pod.own("v2", "cpu.pressure"))
            )
    fields, cgroup = pod.interval(result)
    assert cgroup is not None and fields is not None
    waiting = (after.some_us - before.some_us) * 1000
    print(
        f"\ncontended v2 pod over {INTERVAL:g} s: exported cpu_pressure_waiting_nanos "
        f"{cgroup.cpu_pressure_waiting_nanos / 1e9:.3f} s, run_delay "
        f"{fields.run_delay_nanos / 1e9:.3f} s; kernel cpu.pressure some {waiting / 1e9:.3f} s"
    )
    assert cgroup.cpu_pressure_waiting_nanos > 0.5e9 * INTERVAL  # one of two always waits
    assert close(cgroup.cpu_pressure_waiting_nanos, waiting, 0.05), (cgroup, waiting)
    assert fields.run_delay_nanos > 0.5e9 * INTERVAL
    assert cgroup.cpu_periods is None  # no cpu controller in this v2 tree: no bandwidth


def test_pressure_below_a_still_parent_is_not_read_and_a_stall_below_is(monkeypatch):
    """Two real v2 cgroups under one parent (the QoS class of two pods), one idle process
    in each. While nothing below the parent stalls, its PSI totals stand still and the
    children's PSI files are not read: their carried totals equal the kernel's. Then two
    busy processes contend for one CPU in the second: the parent's `cpu.pressure` moves,
    every child's `cpu.pressure` is read (the contended one's equals the kernel's,
    read right after), their `memory.pressure` and `io.pressure` still are not, and
    every total carried equals the kernel's."""
    from collector.cgroupfs import CgroupFS, Location

    root = hierarchy("v2")
    reads = CgroupReads(monkeypatch)
    parent = f"procdelta-psi-{uuid.uuid4().hex[:8]}"
    names = ("quiet", "contended")
    psi_files = ("cpu.pressure", "memory.pressure", "io.pressure")
    with (
        cgroups(("v2",), f"{parent}/quiet") as quiet,
        cgroups(("v2",), f"{parent}/contended") as busy,
    ):
        dirs = {"quiet": quiet["v2"], "contended": busy["v2"]}
        fs = CgroupFS(  # the shortcut alone: no whole read of the K-pass bound
            os.path.dirname(root) if root.endswith("/unified") else root, whole_read_passes=None
        )
        targets = {
            name: [Location("v2", f"/{parent}/{name}".encode(), None, False)] for name in names
        }
        previous: dict = {}

        def read_pass() -> dict:
            reads.seen.clear()
            got = fs.read_groups(targets, previous)
            fs.release_unused()
            previous.clear()
            previous.update(got)
            return got

        def kernel(name: str) -> tuple:
            return tuple(parse_pressure(read(os.path.join(dirs[name], f))) for f in psi_files)

        def psi_read(name: str) -> set[str]:
            return reads.names_in(dirs[name]) & set(psi_files)

        with Workload(quiet["v2"], "--idle", "1"), Workload(busy["v2"], "--idle", "1"):
            read_pass()
            time.sleep(0.5)
            read_pass()
            time.sleep(0.5)
            still = read_pass()
            assert psi_read("quiet") == psi_read("contended") == set()
            for name in names:
                assert still[name].pressure == kernel(name), name
            with (
                Workload(busy["v2"], "--busy", "1", "--cpu", "0"),
                Workload(busy["v2"], "--busy", "1", "--cpu", "0"),
            ):
                time.sleep(0.5)
                started = read_pass()  # their start-up (it read files from storage) is in
                time.sleep(1.0)
                stalled = read_pass()  # only hashing since: a CPU stall, no memory or I/O one
                after = {name: kernel(name) for name in names}
        assert psi_read("quiet") == psi_read("contended") == {"cpu.pressure"}
    waited = stalled["contended"].pressure[0].some_us - started["contended"].pressure[0].some_us
    print(
        f"\ncontended cgroup over 1 s: cpu.pressure some +{waited} µs; carried and read "
        f"totals equal the kernel's: {all(stalled[n].pressure == after[n] for n in names)}"
    )
    assert waited > 300_000  # one of the two always waits
    assert stalled["quiet"].pressure == after["quiet"]
    assert stalled["contended"].pressure[1:] == after["contended"][1:]  # carried, exact
    assert close(stalled["contended"].pressure[0].some_us, after["contended"][0].some_us, 0.02)


def test_engine_without_cgroup_collector_reads_no_cgroup(tmp_path):
    with Pod(tmp_path, "off") as pod, Workload(list(pod.dirs.values()), "--busy", "1"):
        options = Options(**{**pod.options.__dict__, "cgroup": False})
        engine: Engine = build_engine(options)
        engine.run_pass()
        time.sleep(0.5)
        result = engine.run_pass()
    assert engine.cgroupfs is None and not result.cgroup_intervals
    fields, _ = pod.interval(result)
    assert fields is not None and fields.on_cpu_nanos > 0


@pytest.mark.cpu_shares
def test_a_pod_pinned_to_one_cpu_says_so_and_its_own_threads_are_measured_against_it(tmp_path):
    """A pod whose container v1's cpuset pins to CPU 0 (as the CPU manager's static policy
    does), two busy threads in it: its CPUs are `0`, one CPU, where the collector's own
    cgroup has every CPU (`all`); and its run delay, split on the interval's averages (a
    pod in the v1 hierarchies alone has no CPU pressure), is its own threads' (two
    runnable against one CPU), not its neighbours' (the node has two)."""
    lay_out()
    root = hierarchy("cpuset")
    with Pod(tmp_path, "pinned", kinds=("cpu", "cpuacct", "cpuset")) as pod:
        # a v1 cpuset takes no task before its CPUs and memory nodes are set, level by level
        path = root
        for part in pod.path.split("/"):
            parent, path = path, os.path.join(path, part)
            for name in ("cpuset.cpus", "cpuset.mems"):
                with open(os.path.join(path, name), "w") as out:
                    out.write(read(os.path.join(parent, name)).decode().strip() or "0")
        with open(os.path.join(pod.dirs["cpuset"], "cpuset.cpus"), "w") as out:
            out.write("0")
        options = Options(**{**pod.options.__dict__, "pods_only": False})
        with Workload(list(pod.dirs.values()), "--busy", "2"):
            engine = build_engine(options)
            time.sleep(0.3)
            engine.run_pass()
            time.sleep(INTERVAL)
            result = engine.run_pass()
    (group,) = [g for g in result.cpusets if g.label_dict().get("uid") == pod.uid]
    assert result.cpusets[group] == CpuSet("0", 1)
    node = read(os.path.join(root, "cpuset.effective_cpus")).decode().strip()
    own = [g for g in result.cpusets if g.kind == "cgroup"]
    assert own and all(result.cpusets[g].cpus == "all" for g in own), (node, own)
    split = result.cgroup_intervals[group]
    fields = result.intervals[group]
    print(
        f"\npinned pod, 2 busy threads on CPU 0 of {node}: "
        f"on-CPU {fields.on_cpu_nanos / 1e9:.2f} s, "
        f"run delay {fields.run_delay_nanos / 1e9:.2f} s: own threads "
        f"{(split.run_delay_own_threads_nanos or 0) / 1e9:.2f} s, neighbours "
        f"{(split.run_delay_neighbours_nanos or 0) / 1e9:.2f} s"
    )
    assert split.run_delay_own_threads_nanos is not None
    assert split.run_delay_own_threads_nanos > 0.7 * fields.run_delay_nanos
    assert split.run_delay_neighbours_nanos < 0.3 * fields.run_delay_nanos

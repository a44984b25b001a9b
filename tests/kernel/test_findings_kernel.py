"""Why a pod waits, on the kernel: real pods in real cgroups, `procdelta serve` beside them
and a real Prometheus evaluating the shipped rules, one phase per shape of wait. The pods'
causes come from their cgroups' CPU pressure (the kernel's moment-by-moment basis, which
this project's hosts have): each test asserts that basis first.

1. Held by their own limits, beside a neighbour using half a CPU (so that "a neighbour
   was busy" is not enough to blame it): a pod at its quota with a kubelet-shaped pod
   whose main container is at its limit beside two lively sidecars (a pod-level quota too,
   as kubelet sets it when every container has a limit); then a pod throttled in about a
   third of its periods. Each raises the throttled alert, none the starved one.
2. Behind its own threads: alone with more busy threads than the node's CPUs; three busy
   threads pinned to one CPU (an exclusive cpuset) beside a neighbour busy on the other;
   two pods burning in opposite halves of every second. Never its neighbours' wait.
3. Starved: a one-thread victim pinned to the CPU of a hog with a larger request (kubelet's
   cpu.shares from the requests); a CI-like pod of 300 ms processes on a hog's CPU. Each
   raises the starved alert, and the node pages once, naming the hog.

Needs root, the v1 `cpu` controller beside the v2 tree (this project's hosts) and Debian's
`prometheus`; a missing one fails the test, it does not skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cgroups import Workload, cgroups
from tests.kernel.test_end_to_end import Prometheus
from tests.machine import lay_out
from tests.net import free_port, http_get, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.cpu_shares]
NODE = "findings-node"
KINDS = ("cpu", "cpuacct", "v2")
PERIOD_US = 100_000  # kubelet's CFS period


def shares(request_millicores: int) -> int:
    """kubelet's cpu.shares for a CPU request (MilliCPUToShares)."""
    return max(2, request_millicores * 1024 // 1000)


@dataclass
class Container:
    args: tuple[str, ...]
    limit_millicores: int | None = None


@dataclass
class Pod:
    name: str
    request_millicores: int
    containers: list[Container]
    pod_limit: bool = False  # a pod-level quota, the sum of the limits (every one has one)


@contextlib.contextmanager
def running(pods: list[Pod], logs: Path):
    """The pods laid out as kubelet's cgroupfs driver lays them out on this host's
    hierarchies, their names where kubelet writes them, each container's workload inside."""
    lay_out()  # an idle machine, the CPUs the shapes below assume are the test's
    with contextlib.ExitStack() as stack:
        (logs / "containers").mkdir(parents=True, exist_ok=True)
        for pod in pods:
            uid = str(uuid.uuid4())
            (logs / "pods" / f"e2e_{pod.name}_{uid}").mkdir(parents=True)
            pod_dirs = stack.enter_context(cgroups(KINDS, f"kubepods/burstable/pod{uid}"))
            write(pod_dirs["cpu"], "cpu.shares", shares(pod.request_millicores))
            if pod.pod_limit:
                total = sum(c.limit_millicores or 0 for c in pod.containers)
                write(pod_dirs["cpu"], "cpu.cfs_quota_us", total * PERIOD_US // 1000)
            for container in pod.containers:
                cid = uuid.uuid4().hex * 2
                dirs = stack.enter_context(cgroups(KINDS, f"kubepods/burstable/pod{uid}/{cid}"))
                if container.limit_millicores is not None:
                    quota = container.limit_millicores * PERIOD_US // 1000
                    write(dirs["cpu"], "cpu.cfs_quota_us", quota)
                stack.callback(Workload(list(dirs.values()), *container.args).stop)
        yield


def write(directory: str, name: str, value: int) -> None:
    with open(os.path.join(directory, name), "w") as file:
        file.write(str(value))


@contextlib.contextmanager
def serving(logs: Path):
    """`procdelta serve` (a pass a second) on loopback, naming the pods from `logs`: its
    address."""
    port = free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "collector", "serve", "--interval", "1",
         "--web.listen-address", f"127.0.0.1:{port}",
         "--path.pod-logs", str(logs / "pods"),
         "--path.container-logs", str(logs / "containers")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz"), 30, "procdelta healthy")
        yield f"127.0.0.1:{port}"
    finally:
        collector.terminate()
        collector.wait(timeout=10)


@contextlib.contextmanager
def observed(logs: Path, directory: Path):
    """`procdelta serve` (a pass a second) and Prometheus scraping it with the shipped
    rules (windows shortened, tests/kernel/test_end_to_end.py's RULE_WINDOW)."""
    with serving(logs) as target:
        prometheus = Prometheus(directory, [target], labels={"node": NODE})
        try:
            wait_until(
                lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
                90,
                "25 scrapes of procdelta (the rules' windows full)",
            )
            yield prometheus
        finally:
            prometheus.stop()


def per_pod(prometheus: Prometheus, query: str) -> dict[str, float]:
    """A query's value for each e2e pod."""
    return {
        s["metric"]["pod"]: float(s["value"][1])
        for s in prometheus.query(query)
        if s["metric"].get("namespace") == "e2e"
    }


def alerts(prometheus: Prometheus, name: str) -> dict[str, dict]:
    """The e2e pods' pending or firing alerts of one name, with labels and annotations."""
    answer = json.loads(http_get(f"{prometheus.url}/api/v1/alerts"))
    return {
        a["labels"]["pod"]: a
        for a in answer["data"]["alerts"]
        if a["labels"]["alertname"] == name and a["labels"].get("namespace") == "e2e"
    }


WAIT = 'sum without (cause) (node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{{cause="{}"}})'


def on_the_kernels_basis(prometheus: Prometheus, pods: set[str]) -> None:
    """The pods' causes come from their cgroups' CPU pressure, not the interval's split."""
    stalled = per_pod(prometheus, "rate(procdelta_cpu_stalled_neighbours_nanos_total[20s])")
    split = per_pod(prometheus, "rate(procdelta_run_delay_neighbours_nanos_total[20s])")
    assert pods <= set(stalled) and not pods & set(split), (stalled, split)


def node_pages(prometheus: Prometheus) -> list[dict]:
    """The node's page, pending or firing."""
    answer = json.loads(http_get(f"{prometheus.url}/api/v1/alerts"))
    return [
        a
        for a in answer["data"]["alerts"]
        if a["labels"]["alertname"] == "ProcdeltaNodeCPUSaturated"
        and a["labels"].get("node") == NODE
    ]


def shares_of(prometheus: Prometheus) -> dict[str, dict[str, float]]:
    found = {cause: per_pod(prometheus, WAIT.format(cause)) for cause in CAUSES}
    found["cores"] = {
        pod: v / 1e9
        for pod, v in per_pod(
            prometheus, "node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m"
        ).items()
    }
    for name, values in found.items():
        print(name, {pod: round(value, 3) for pod, value in values.items()})
    return found


CAUSES = ("neighbours", "throttled", "own_threads")


NEIGHBOUR = Pod("neighbour", 500, [Container(("--duty", "5:10"))])
"""Half a CPU, in 5 ms bursts: a neighbour that is busy, not one that holds the CPUs."""


def limited_beside_a_neighbour(tmp_path: Path, limited: list[Pod]) -> dict[str, dict]:
    """Run `limited` beside NEIGHBOUR until each raises the throttled alert; then none of
    them has the starved one, and the node does not page. Their recorded shares, by rule."""
    names = {pod.name for pod in limited}
    logs = tmp_path / "logs"
    with running([*limited, NEIGHBOUR], logs), observed(logs, tmp_path) as prometheus:
        wait_until(
            lambda: set(alerts(prometheus, "ProcdeltaPodCPUThrottled")) >= names,
            60,
            f"the throttled alert pending for {sorted(names)}",
        )
        on_the_kernels_basis(prometheus, names)
        shares = {
            "held": per_pod(prometheus, WAIT.format("throttled")),
            "neighbours": per_pod(prometheus, WAIT.format("neighbours")),
            "periods": per_pod(
                prometheus, "node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m"
            ),
            "cores": {
                pod: value / 1e9
                for pod, value in per_pod(
                    prometheus, "node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m"
                ).items()
            },
        }
        for name, values in shares.items():
            print(name, {pod: round(value, 3) for pod, value in values.items()})
        assert 0.3 < shares["cores"]["neighbour"] < 0.7  # the neighbour used about half a CPU
        for pod in names:
            assert shares["neighbours"][pod] < 0.25, pod
        assert not set(alerts(prometheus, "ProcdeltaPodCPUStarved")) & names
        assert node_pages(prometheus) == []  # pods at their limits do not page the node
        return shares


def test_at_its_quota_and_kubelet_shaped_beside_a_neighbour_at_half_a_cpu(tmp_path):
    shares = limited_beside_a_neighbour(
        tmp_path,
        [
            Pod("at-quota", 200, [Container(("--busy", "1"), 200)]),
            Pod(
                "kubelet-shaped",
                2200,
                [
                    Container(("--busy", "1"), 200),
                    Container(("--sleepers", "1"), 1000),
                    Container(("--sleepers", "1"), 1000),
                ],
                pod_limit=True,
            ),
        ],
    )
    held, periods = shares["held"], shares["periods"]
    assert held["at-quota"] > 0.6 and periods["at-quota"] > 0.8
    # the main container at its limit: its quota held the pod most of its runnable time,
    # while the sidecars' and the pod's own periods dilute the throttled periods' share
    # (4 quotas, one throttled: at most a quarter, under CPUThrottlingHigh's threshold)
    assert held["kubelet-shaped"] > 0.5 and periods["kubelet-shaped"] <= 0.26


def test_throttled_in_a_third_of_its_periods_beside_a_neighbour_at_half_a_cpu(tmp_path):
    # 40 ms of CPU every 300 ms under a 20 ms quota: throttled in about a third of its
    # periods (measured 0.28 to 0.38)
    shares = limited_beside_a_neighbour(
        tmp_path, [Pod("a-third", 200, [Container(("--duty", "40:300"), 200)])]
    )
    assert 0.2 < shares["periods"]["a-third"] < 0.5


def two_cpus() -> None:
    """The layouts below place busy threads on CPUs 0 and 1 of a two-CPU node (CI's);
    with more CPUs, the shapes would not be the ones tested."""
    assert os.cpu_count() == 2, f"these shapes are laid out for 2 CPUs, not {os.cpu_count()}"


def behind_its_own_threads(tmp_path: Path, pods: list[Pod], own: str | None) -> dict:
    """Run `pods` until `own` raises the own-threads alert (with None, over the rules' full
    windows); none of them is starved, and the node does not page. Their recorded shares."""
    names = {pod.name for pod in pods}
    logs = tmp_path / "logs"
    with running(pods, logs), observed(logs, tmp_path) as prometheus:
        if own is not None:
            wait_until(
                lambda: own in alerts(prometheus, "ProcdeltaPodCPUOwnThreads"),
                60,
                f"the own-threads alert pending for {own}",
            )
        on_the_kernels_basis(prometheus, names)
        shares = shares_of(prometheus)
        for pod in names:
            assert shares["neighbours"][pod] < 0.1, pod
        assert not set(alerts(prometheus, "ProcdeltaPodCPUStarved")) & names
        assert node_pages(prometheus) == []
        return shares


def test_alone_with_more_busy_threads_than_cpus(tmp_path):
    cpus = os.cpu_count()
    shares = behind_its_own_threads(
        tmp_path, [Pod("threads", 1000, [Container(("--busy", str(2 * cpus)))])], "threads"
    )
    # twice as many busy threads as CPUs: some of them always wait while others run
    assert (
        shares["own_threads"]["threads"] > 0.6
    )  # (0.98 alone on the machine, 0.71 beside a busy one)


def test_pinned_behind_its_own_threads_beside_a_neighbour_on_the_other_cpu(tmp_path):
    """Three busy threads that may use one CPU (an exclusive cpuset from the static CPU
    manager, here their affinity), a neighbour busy on the other: one of the three always
    runs, so it is never stalled whole, and its wait is its own threads' (an interval split
    gave the neighbour 0.48 of its runnable time: the node had a CPU to spare on average)."""
    two_cpus()
    pods = [
        Pod("pinned", 1000, [Container(("--busy", "3", "--busy-cpus", "0,0,0"))]),
        Pod("beside", 1000, [Container(("--busy", "1", "--busy-cpus", "1"))]),
    ]
    shares = behind_its_own_threads(tmp_path, pods, "pinned")
    assert shares["own_threads"]["pinned"] > 0.8
    assert 0.8 < shares["cores"]["pinned"] < 1.1 and 0.8 < shares["cores"]["beside"] < 1.1


def test_two_pods_burning_in_turns_wait_behind_themselves(tmp_path):
    """Three busy threads in the first half of every second, two in the second half, on two
    CPUs: each pod waits only behind itself, in its own half (an interval split, seeing
    each use a core on average on a busy node, blamed the other)."""
    two_cpus()
    pods = [
        Pod("first-half", 1000, [Container(("--busy", "3", "--burst", "0:500"))]),
        Pod("second-half", 1000, [Container(("--busy", "2", "--burst", "500:500"))]),
    ]
    shares = behind_its_own_threads(tmp_path, pods, None)
    # the three wait behind each other in their half (the interpreter's lock keeps fewer
    # of them runnable than three: measured 0.25 of the second); the two never
    assert shares["own_threads"]["first-half"] > 0.1
    assert shares["own_threads"]["second-half"] < 0.05


def starved_beside_a_hog(tmp_path: Path, victim: Pod, hog: Pod) -> dict:
    """Run `victim` beside `hog` until the victim's starved alert and its node's page are
    pending: the page names the hog; the hog is not starved. Their recorded shares."""
    pods = [victim, hog]
    logs = tmp_path / "logs"
    with running(pods, logs), observed(logs, tmp_path) as prometheus:
        wait_until(
            lambda: (
                victim.name in alerts(prometheus, "ProcdeltaPodCPUStarved")
                and node_pages(prometheus)
            ),
            60,
            f"the starved alert and the node's page pending for {victim.name}",
        )
        on_the_kernels_basis(prometheus, {victim.name, hog.name})
        shares = shares_of(prometheus)
        assert shares["neighbours"][victim.name] > 0.5
        assert shares["neighbours"][hog.name] < 0.25
        assert hog.name not in alerts(prometheus, "ProcdeltaPodCPUStarved")
        alert = alerts(prometheus, "ProcdeltaPodCPUStarved")[victim.name]
        assert alert["labels"]["node"] == NODE
        # the pod's text points at its node's page, which names who held the CPUs
        assert "ProcdeltaNodeCPUSaturated" in alert["annotations"]["description"]
        assert f"e2e/{hog.name}" not in alert["annotations"]["description"]
        assert alert["annotations"]["runbook_url"].endswith("runbooks.md#procdeltapodcpustarved")
        (page,) = node_pages(prometheus)
        assert page["labels"]["severity"] == "critical"
        description = page["annotations"]["description"]
        print(description)
        # no kube-state-metrics here: no group's entitlement is known, so none is named as
        # held beyond it; the starved pod is named, and the hog the busiest beside it
        before, _, beside = description.partition("Busiest pods beside them:")
        assert "No group there used more than its entitlement" in before
        assert f"e2e/{victim.name}" in before.partition("Starved:")[2]
        assert f"e2e/{hog.name}" in beside
        return shares


def test_a_pinned_victim_of_a_hog(tmp_path):
    """A one-thread pod pinned to the CPU where a hog with five times its request runs three
    busy threads (kubelet's cpu.shares from the requests): it gets about a sixth of the CPU,
    and none of its tasks runs for the rest."""
    two_cpus()
    shares = starved_beside_a_hog(
        tmp_path,
        Pod("victim", 200, [Container(("--busy", "1", "--busy-cpus", "0"))]),
        Pod("hog", 1000, [Container(("--busy", "3", "--busy-cpus", "0,0,0"))]),
    )
    assert 0.1 < shares["cores"]["victim"] < 0.3


def test_a_pod_of_short_processes_on_a_hogs_cpu(tmp_path):
    """A CI-like pod whose work is 300 ms processes, one after another, on the CPU of a
    two-thread hog with five times its request: its cgroup (every child, exited ones
    included) uses more than the 0.1-core floor and waits most of the time; it is found
    starved, on its cgroup's account."""
    two_cpus()
    shares = starved_beside_a_hog(
        tmp_path,
        Pod("ci", 200, [Container(("--children", "300", "--cpu", "0"))]),
        Pod("hog", 1000, [Container(("--busy", "2", "--busy-cpus", "0,0"))]),
    )
    assert 0.1 < shares["cores"]["ci"] < 0.3

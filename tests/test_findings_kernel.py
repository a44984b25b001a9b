"""Why a pod waits, on the kernel: real pods in real cgroups, `procdelta serve` beside them
and a real Prometheus evaluating the shipped rules, one phase per shape of wait.

1. Held by their own limits, beside a neighbour using half a CPU (so that "a neighbour
   was busy" is not enough to blame it): a pod at its quota with a kubelet-shaped pod
   whose main container is at its limit beside two lively sidecars (a pod-level quota too,
   as kubelet sets it when every container has a limit); then a pod throttled in about a
   third of its periods (alone with the neighbour: beside the other two, their bursts at
   each period's start hold both CPUs, and a part of its wait is theirs indeed). Each
   raises the throttled alert, none the starved one.
2. Alone with more busy threads than the node's CPUs: its own threads' wait, never its
   neighbours'.
3. Crowded by a busier neighbour with a larger request (kubelet's cpu.shares from the
   requests: with equal weights a one-thread pod beside a four-thread pod keeps a whole
   CPU): starved, the alert naming its node and the neighbour.

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
from tests.net import free_port, http_get, wait_until
from tests.test_end_to_end import Prometheus

pytestmark = pytest.mark.kernel
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
def observed(logs: Path, directory: Path):
    """`procdelta serve` (a pass a second) and Prometheus scraping it with the shipped
    rules (windows shortened, tests/test_end_to_end.py's RULE_WINDOW)."""
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
        prometheus = Prometheus(directory, [f"127.0.0.1:{port}"], labels={"node": NODE})
        try:
            wait_until(
                lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
                90,
                "25 scrapes of procdelta (the rules' windows full)",
            )
            yield prometheus
        finally:
            prometheus.stop()
    finally:
        collector.terminate()
        collector.wait(timeout=10)


def per_pod(prometheus: Prometheus, rule: str) -> dict[str, float]:
    return {
        s["metric"]["pod"]: float(s["value"][1])
        for s in prometheus.query(f'{rule}{{namespace="e2e"}}')
    }


def alerts(prometheus: Prometheus, name: str) -> dict[str, dict]:
    """The e2e pods' pending or firing alerts of one name, with labels and annotations."""
    answer = json.loads(http_get(f"{prometheus.url}/api/v1/alerts"))
    return {
        a["labels"]["pod"]: a
        for a in answer["data"]["alerts"]
        if a["labels"]["alertname"] == name and a["labels"].get("namespace") == "e2e"
    }


WAIT = "node_namespace_pod:procdelta_cpu_wait_{}:ratio_rate5m"


NEIGHBOUR = Pod("neighbour", 500, [Container(("--duty", "5:10"))])
"""Half a CPU, in 5 ms bursts: a neighbour that is busy, not one that holds the CPUs."""


def limited_beside_a_neighbour(tmp_path: Path, limited: list[Pod]) -> dict[str, dict]:
    """Run `limited` beside NEIGHBOUR until each raises the throttled alert; then none of
    them has the starved one. Their recorded shares, by rule."""
    names = {pod.name for pod in limited}
    logs = tmp_path / "logs"
    with running([*limited, NEIGHBOUR], logs), observed(logs, tmp_path) as prometheus:
        wait_until(
            lambda: set(alerts(prometheus, "ProcdeltaPodCPUThrottled")) >= names,
            60,
            f"the throttled alert pending for {sorted(names)}",
        )
        shares = {
            "held": per_pod(prometheus, WAIT.format("throttled")),
            "neighbours": per_pod(prometheus, WAIT.format("neighbours")),
            "periods": per_pod(
                prometheus, "node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m"
            ),
            "cores": {
                pod: value / 1e9
                for pod, value in per_pod(
                    prometheus, "node_namespace_pod:procdelta_on_cpu_nanos:rate5m"
                ).items()
            },
        }
        for name, values in shares.items():
            print(name, {pod: round(value, 3) for pod, value in values.items()})
        assert 0.3 < shares["cores"]["neighbour"] < 0.7  # the neighbour used about half a CPU
        for pod in names:
            assert shares["neighbours"][pod] < 0.25, pod
        assert not set(alerts(prometheus, "ProcdeltaPodCPUStarved")) & names
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


def test_alone_with_more_busy_threads_than_cpus(tmp_path):
    cpus = os.cpu_count()
    pods = [Pod("threads", 1000, [Container(("--busy", str(2 * cpus)))])]
    with running(pods, tmp_path / "logs"), observed(tmp_path / "logs", tmp_path) as prometheus:
        wait_until(
            lambda: "threads" in alerts(prometheus, "ProcdeltaPodCPUOwnThreads"),
            60,
            "the own-threads alert pending",
        )
        own = per_pod(prometheus, WAIT.format("own_threads"))["threads"]
        neighbours = per_pod(prometheus, WAIT.format("neighbours"))["threads"]
        print(f"threads: own threads' {own:.3f}, neighbours' {neighbours:.3f}")
        # twice as many busy threads as CPUs: about half of their runnable time queued,
        # all but a sliver behind each other
        assert 0.35 < own < 0.55 and neighbours < 0.1
        assert "threads" not in alerts(prometheus, "ProcdeltaPodCPUStarved")


def test_crowded_by_a_busier_neighbour_with_a_larger_request(tmp_path):
    pods = [
        Pod("crowded", 100, [Container(("--busy", "1"))]),
        Pod("hog", 2000, [Container(("--busy", "3"))]),
    ]
    with running(pods, tmp_path / "logs"), observed(tmp_path / "logs", tmp_path) as prometheus:
        wait_until(
            lambda: "crowded" in alerts(prometheus, "ProcdeltaPodCPUStarved"),
            60,
            "the starved alert pending for the crowded pod",
        )
        neighbours = per_pod(prometheus, WAIT.format("neighbours"))
        own = per_pod(prometheus, WAIT.format("own_threads"))
        print(f"neighbours' {neighbours}, own threads' {own}")
        assert neighbours["crowded"] > 0.5
        # the hog waits too, but behind its own three threads on two CPUs
        assert neighbours["hog"] < 0.25 and own["hog"] > neighbours["hog"]
        assert "hog" not in alerts(prometheus, "ProcdeltaPodCPUStarved")
        alert = alerts(prometheus, "ProcdeltaPodCPUStarved")["crowded"]
        assert alert["labels"]["node"] == NODE
        assert "e2e/hog" in alert["annotations"]["description"]
        assert alert["annotations"]["runbook_url"].endswith(
            "findings.md#starved-waiting-while-neighbours-hold-the-cpus"
        )

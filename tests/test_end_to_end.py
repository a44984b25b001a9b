"""End to end: a real Prometheus scrapes `procdelta serve` watching a real busy pod.

Debian's `prometheus` is started on a free loopback port with a temporary config and
stopped by the test; a missing binary fails the test, it does not skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

from tests.cgroups import Workload, cgroup, cgroups
from tests.net import free_port, http_get, wait_until
from tests.promtools import binary
from tests.test_deploy import RULES, dashboard_queries, recording_rule_queries

pytestmark = pytest.mark.kernel
ROOT = Path(__file__).parent.parent


RULE_WINDOW = "20s"
"""The rules' `[5m]` windows, shortened for a test that lasts tens of seconds: `rate()`
divides by its whole window, so over a 5m window that holds 10 s of samples every rate
reads 30 times too low (ratios are unaffected). Expressions and thresholds are the file's."""


class Prometheus:
    """A throwaway Prometheus server on loopback, scraping the given targets every second
    and evaluating a rule file, the project's by default (windows of `RULE_WINDOW`), every
    second."""

    def __init__(self, directory: Path, targets: list[str], rule_file: Path = RULES):
        self.port = free_port()
        rules = directory / "procdelta.rules.yml"
        rules.write_text(rule_file.read_text().replace("[5m]", f"[{RULE_WINDOW}]"))
        config = directory / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            "  - job_name: procdelta\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = open(directory / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: http_get(f"{self.url}/-/ready"), 60, "prometheus ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, promql: str) -> list[dict]:
        body = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def busy_pod(tmp_path_factory):
    """Two pods: busy-pod, three busy threads on two CPUs (contended: each waits a third
    of the time) in a v2 cgroup, systemd driver; throttled-pod, one busy thread under
    its container's 20% CPU quota, cgroupfs driver on this host's v1 controllers."""
    tmp_path = tmp_path_factory.mktemp("logs")
    uid, throttled_uid = str(uuid.uuid4()), str(uuid.uuid4())
    cid, throttled_cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    (tmp_path / "pods" / f"e2e_busy-pod_{uid}").mkdir(parents=True)
    (tmp_path / "pods" / f"e2e_throttled-pod_{throttled_uid}").mkdir(parents=True)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"busy-pod_e2e_burner-{cid}.log").touch()
    path = (
        "kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )
    throttled_path = f"kubepods/burstable/pod{throttled_uid}/{throttled_cid}"
    with contextlib.ExitStack() as stack:
        cgroup_path = stack.enter_context(cgroup("v2", path))
        busy = stack.enter_context(Workload(cgroup_path, "--busy", "3", "--sleepers", "1"))
        throttled = stack.enter_context(cgroups(("cpu", "cpuacct", "v2"), throttled_path))
        with open(Path(throttled["cpu"]) / "cpu.cfs_quota_us", "w") as quota:
            quota.write("20000")
        stack.enter_context(Workload(list(throttled.values()), "--busy", "1"))
        yield tmp_path, uid, busy.pid


@pytest.fixture(scope="module")
def collector(busy_pod):
    logs, uid, _ = busy_pod
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "collector",
            "serve",
            "--interval",
            "1",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--path.pod-logs",
            str(logs / "pods"),
            "--path.container-logs",
            str(logs / "containers"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/healthz"), 30, "procdelta healthy")
        yield f"127.0.0.1:{port}", uid
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, collector):
    target, _ = collector
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), [target])
    try:
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_and_queries(prometheus, collector):
    _, uid = collector
    pod = f'namespace="e2e",pod="busy-pod",uid="{uid}"'

    up = wait_until(lambda: prometheus.query('up{job="procdelta"} == 1'), 30, "target up")
    assert len(up) == 1

    # Counters, with rate() over them: three busy threads on two cores, ~2 cores used.
    wait_until(
        lambda: prometheus.query(
            f"count_over_time(procdelta_on_cpu_nanos_total{{{pod}}}[6s]) >= 5"
        ),
        40,
        "five scrapes of the pod's on-CPU counter",
    )
    cores = prometheus.query(f"rate(procdelta_on_cpu_nanos_total{{{pod}}}[5s]) / 1e9")
    assert len(cores) == 1
    assert cores[0]["metric"]["qos"] == "burstable"
    assert 1.0 < float(cores[0]["value"][1]) < 2.5

    # Interval gauges, divided at query time: the share of the pod's time spent waiting.
    delay = f"procdelta_interval_run_delay_nanos{{{pod}}}"
    on_cpu = f"procdelta_interval_on_cpu_nanos{{{pod}}}"
    starvation = prometheus.query(f"{delay} / ({delay} + {on_cpu})")
    assert len(starvation) == 1
    assert 0.05 < float(starvation[0]["value"][1]) < 0.95

    per_observed = prometheus.query(
        f"procdelta_interval_run_delay_nanos{{{pod}}} / procdelta_interval_observed_nanos{{{pod}}}"
    )
    assert len(per_observed) == 1 and float(per_observed[0]["value"][1]) > 0

    switches = prometheus.query(f"rate(procdelta_voluntary_switches_total{{{pod}}}[5s])")
    assert len(switches) == 1 and float(switches[0]["value"][1]) > 100  # the 1 ms sleeper

    passes = prometheus.query("rate(procdelta_passes_total[5s])")
    assert len(passes) == 1 and 0.5 < float(passes[0]["value"][1]) < 1.5

    build = prometheus.query("procdelta_build_info")
    assert len(build) == 1 and build[0]["metric"]["version"]


@pytest.mark.parametrize(
    "query", dashboard_queries() + recording_rule_queries(), ids=lambda q: q[:60]
)
def test_every_dashboard_query_and_recording_rule_returns_data(prometheus, collector, query):
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 4"),
        60,
        "four scrapes of procdelta",
    )
    result = prometheus.query(query)
    assert result, f"no data for: {query}"


def panel_query(title: str, window: str) -> str:
    """The first query of a dashboard panel, its variables set as for "All"."""
    model = json.loads((ROOT / "grafana" / "procdelta.json").read_text())
    (panel,) = [p for p in model["panels"] if p["title"] == title]
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", window)
    return expr.replace("$node", ".*").replace("$namespace", ".*").replace("$pod", ".*")


def kernel_window(pid: int, seconds: float) -> tuple[float, float]:
    """The oracle: cores used and starvation (run delay / (run delay + on-CPU)) of a
    process over the next `seconds`, from its threads' own schedstat files."""

    def sample() -> tuple[float, int, int]:
        on_cpu = delay = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
                ran, waited, _ = schedstat.read().split()
            on_cpu, delay = on_cpu + int(ran), delay + int(waited)
        return time.monotonic(), on_cpu, delay

    began, on_cpu_before, delay_before = sample()
    time.sleep(seconds)
    ended, on_cpu_after, delay_after = sample()
    on_cpu, delay = on_cpu_after - on_cpu_before, delay_after - delay_before
    return on_cpu / 1e9 / (ended - began), delay / (delay + on_cpu)


def test_dashboard_starvation_and_cores_say_what_the_kernel_says(prometheus, busy_pod):
    """The dashboard's two headline panels, evaluated by Prometheus over the last 10 s,
    against the busy pod's threads' schedstat read by the test over the same 10 s."""
    _, _, pid = busy_pod
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[12s]) >= 10"),
        60,
        "ten scrapes of procdelta",
    )
    cores_seen, starvation_seen = kernel_window(pid, 10.0)

    def busy_pod_value(title: str) -> float:
        series = [
            s
            for s in prometheus.query(panel_query(title, "10s"))
            if s["metric"].get("pod") == "busy-pod"
        ]
        assert len(series) == 1, series
        return float(series[0]["value"][1])

    cores, starvation = busy_pod_value("Cores used"), busy_pod_value("CPU starvation")
    print(f"busy-pod over 10 s: cores {cores:.3f} (kernel {cores_seen:.3f}), "
          f"starvation {starvation:.3f} (kernel {starvation_seen:.3f})")  # fmt: skip
    # three busy threads on two CPUs: close to two cores, each thread waiting about a
    # third of its runnable time; scrapes land up to a second off the test's window
    assert cores_seen > 1.2 and 0.15 < starvation_seen < 0.7  # the workload did contend
    assert cores == pytest.approx(cores_seen, rel=0.15)
    assert starvation == pytest.approx(starvation_seen, abs=0.08)


def recorded(prometheus: Prometheus, rule: str, pod: str) -> float:
    """The value Prometheus recorded for a pod with one of the project's rules."""
    series = wait_until(
        lambda: prometheus.query(f'{rule}{{namespace="e2e",pod="{pod}"}}'),
        60,
        f"{rule} recorded for {pod}",
    )
    assert len(series) == 1, series
    return float(series[0]["value"][1])


def pending(prometheus: Prometheus, alert: str) -> set[str]:
    """The pods for which an alert of the rule file is pending (its `for` not yet over)."""
    return {
        s["metric"]["pod"]
        for s in prometheus.query(f'ALERTS{{alertname="{alert}",namespace="e2e"}}')
    }


def test_rules_tell_the_throttled_pod_from_the_contended_one(prometheus, collector):
    """A real Prometheus evaluates the rule file on what the collector scraped from the
    kernel: the throttled pod's throttled share, and which alert each pod raises."""
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
        90,
        "25 scrapes of procdelta (the rules' windows full)",
    )
    share = "namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m"
    assert recorded(prometheus, share, "throttled-pod") > 0.5
    assert not prometheus.query(f'{share}{{pod="busy-pod"}}')  # no quota: no share at all
    starvation = "namespace_pod:procdelta_cpu_starvation:ratio_rate5m"
    assert recorded(prometheus, starvation, "throttled-pod") > 0.5  # its run delay: its quota
    assert recorded(prometheus, starvation, "busy-pod") > 0.25  # 3 threads, 2 CPUs
    assert recorded(prometheus, "namespace_pod:procdelta_cores_used:rate5m", "throttled-pod") > 0.1
    coverage = recorded(prometheus, "namespace_pod:procdelta_cpu_coverage:ratio_rate5m", "busy-pod")
    assert 0.9 < coverage < 1.1  # one long-lived process: the sums see all of its CPU

    def both_pending() -> bool:
        return "throttled-pod" in pending(prometheus, "ProcdeltaPodCPUThrottled") and (
            "busy-pod" in pending(prometheus, "ProcdeltaPodCPUStarved")
        )

    wait_until(both_pending, 60, "the throttled and the starvation alerts pending")
    assert "busy-pod" not in pending(prometheus, "ProcdeltaPodCPUThrottled")
    assert "throttled-pod" not in pending(prometheus, "ProcdeltaPodCPUStarved")

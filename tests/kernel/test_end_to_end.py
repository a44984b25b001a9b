"""End to end: a real Prometheus scrapes `procdelta serve` watching a real busy pod.

Debian's `prometheus` is started on a free loopback port with a temporary config and
stopped by the test; a missing binary fails the test, it does not skip.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
import yaml

from tests.cgroups import Workload, cgroup, cgroups, weighed
from tests.integration.test_deploy import (
    RULES,
    dashboard_queries,
    recording_rule_queries,
    set_variables,
)
from tests.machine import lay_out
from tests.net import free_port, http_get, wait_until
from tests.promtools import binary

pytestmark = [pytest.mark.kernel, pytest.mark.cpu_shares]
ROOT = Path(__file__).parents[2]


RULE_WINDOW = "20s"
"""The rules' `[5m]` windows, shortened for a test that lasts tens of seconds: `rate()`
divides by its whole window, so over a 5m window that holds 10 s of samples every rate
reads 30 times too low (ratios are unaffected). Expressions and thresholds are the file's."""


def shortened(rules: str) -> str:
    """A rule file's text for a test that lasts tens of seconds: its `[5m]` windows
    `RULE_WINDOW` long, and the groups evaluated on an interval of their own (the per-pod
    and workload groups' minute) evaluated with the others, every second, however the
    file is laid out (the plain file, or a chart's groups dumped). Expressions and
    thresholds are the file's."""
    spec = yaml.safe_load(rules.replace("[5m]", f"[{RULE_WINDOW}]"))
    for group in spec["groups"]:
        group.pop("interval", None)
    return yaml.safe_dump(spec, sort_keys=False, width=10_000)


class Prometheus:
    """A throwaway Prometheus server on loopback, scraping the given targets every second
    and evaluating a rule file, the project's by default (windows of `RULE_WINDOW`), every
    second. `labels` are set on procdelta's targets (the `node` the monitors set);
    `kube_state_metrics` is a target scraped as the job `kube-state-metrics`."""

    def __init__(
        self,
        directory: Path,
        targets: list[str],
        rule_file: Path = RULES,
        labels: dict[str, str] | None = None,
        kube_state_metrics: str | None = None,
    ):
        self.port = free_port()
        rules = directory / "procdelta.rules.yml"
        rules.write_text(shortened(rule_file.read_text()))
        config = directory / "prometheus.yml"
        text = (
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            "  - job_name: procdelta\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
            f"        labels: {json.dumps(labels or {})}\n"
        )
        if kube_state_metrics:
            text += (
                "  - job_name: kube-state-metrics\n"
                "    static_configs:\n"
                f"      - targets: {json.dumps([kube_state_metrics])}\n"
            )
        config.write_text(text)
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


NODE = "e2e-node"
WEB = {f"web-5d8c9b7f4-{suffix}": str(uuid.uuid4()) for suffix in ("x2k9p", "q7m4z")}
"""Deployment web's two pods (ReplicaSet web-5d8c9b7f4), by name: their uids."""
THROTTLED_UID = str(uuid.uuid4())


def systemd_pod_path(uid: str, cid: str) -> str:
    return (
        "kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


@pytest.fixture(scope="module")
def busy_pod(tmp_path_factory):
    """Four pods: busy-pod, three busy threads (and a sleeper) in a v2 cgroup, systemd
    driver; Deployment web's two pods, one busy thread each, beside it; throttled-pod, one
    busy thread under its container's 20% CPU quota (and a requested pod's weight),
    cgroupfs driver on this host's v1 controllers. About five runnable threads on this
    machine's two CPUs: every busy pod contends, and busy-pod, with three of them, uses
    the most.

    Each busy thread has its CPU, so that the scheduler's balancing decides none of this:
    left to it, the throttled pod's weight (its load, to the balancer) kept one CPU for it
    and one web pod, which then ran 0.8 of a core and waited for nobody. CPU 0: two of
    busy-pod's threads and one web pod's (a third of a core each); CPU 1: busy-pod's third,
    the other web pod's (0.4 each) and throttled-pod's, which runs its 20% at once."""
    assert len(os.sched_getaffinity(0)) == 2, "the pods are laid out for two CPUs, 0 and 1"
    lay_out()  # an idle machine: the shares below are measured on CPUs taken as the test's
    tmp_path = tmp_path_factory.mktemp("logs")
    uid, throttled_uid = str(uuid.uuid4()), THROTTLED_UID
    cid, throttled_cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    (tmp_path / "pods" / f"e2e_busy-pod_{uid}").mkdir(parents=True)
    (tmp_path / "pods" / f"e2e_throttled-pod_{throttled_uid}").mkdir(parents=True)
    for name, web_uid in WEB.items():
        (tmp_path / "pods" / f"e2e_{name}_{web_uid}").mkdir(parents=True)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"busy-pod_e2e_burner-{cid}.log").touch()
    throttled_path = f"kubepods/burstable/pod{throttled_uid}/{throttled_cid}"
    with contextlib.ExitStack() as stack:
        cgroup_path = stack.enter_context(cgroup("v2", systemd_pod_path(uid, cid)))
        busy = stack.enter_context(
            Workload(cgroup_path, "--busy", "3", "--busy-cpus", "0,0,1", "--sleepers", "1")
        )
        for cpu, web_uid in enumerate(WEB.values()):
            web_path = stack.enter_context(
                cgroup("v2", systemd_pod_path(web_uid, uuid.uuid4().hex * 2))
            )
            stack.enter_context(Workload(web_path, "--busy", "1", "--cpu", str(cpu)))
        throttled = stack.enter_context(cgroups(("cpu", "cpuacct", "v2"), throttled_path))
        with open(Path(throttled["cpu"]) / "cpu.cfs_quota_us", "w") as quota:
            quota.write("20000")
        # Its weight is a requested pod's beside BestEffort neighbours, in the ratio a kubelet
        # sets (a 200m request: cpu.shares 204; BestEffort: 2), on its cgroup and every one
        # above it (the neighbours' tasks sit at this hierarchy's root, 1024 each, beside
        # kubepods): once its quota refills it runs at once, so its run delay is its quota's.
        # With equal weights the scheduler shares the CPUs fairly and it also waits for its
        # neighbours before each period's 20 ms (measured: 0.37 of its runnable time
        # throttled, as much again for neighbours), which is the truth and what the rules
        # then say.
        stack.enter_context(weighed(throttled["cpu"], 1024 * 204 // 2))
        stack.enter_context(Workload(list(throttled.values()), "--busy", "1", "--cpu", "1"))
        yield tmp_path, uid, busy.pid


def kube_state_metrics_page(busy_uid: str) -> bytes:
    """What kube-state-metrics says of the pods and the node: web's pods are a
    Deployment's (through its ReplicaSet), throttled-pod a StatefulSet's, busy-pod has no
    owner (empty owner labels); pods of every other kind elsewhere; the node's CPUs, none
    reserved."""
    owner = "owner_kind={!r},owner_name={!r},owner_is_controller={!r}"
    lines = ["# TYPE kube_pod_owner gauge"]
    for name, web_uid in WEB.items():
        labels = owner.format("ReplicaSet", "web-5d8c9b7f4", "true")
        lines.append(f'kube_pod_owner{{namespace="e2e",pod="{name}",uid="{web_uid}",{labels}}} 1')
    labels = owner.format("StatefulSet", "throttled", "true")
    lines.append(
        f'kube_pod_owner{{namespace="e2e",pod="throttled-pod",uid="{THROTTLED_UID}",{labels}}} 1'
    )
    labels = owner.format("", "", "")
    lines.append(f'kube_pod_owner{{namespace="e2e",pod="busy-pod",uid="{busy_uid}",{labels}}} 1')
    # pods of the other kinds, on nodes procdelta does not watch here: in the map from
    # kube-state-metrics, not among the pods procdelta saw
    for pod, kind, name in (
        ("legacy-5c9f8-qwert", "ReplicaSet", "legacy-5c9f8"),
        ("backfill-xyz12", "Job", "backfill"),
        ("agent-x1", "DaemonSet", "agent"),
        ("kube-apiserver-n1", "Node", "n1"),
    ):
        labels = owner.format(kind, name, "true")
        lines.append(f'kube_pod_owner{{namespace="elsewhere",pod="{pod}",uid="u",{labels}}} 1')
    # the node reserves nothing for its own processes (allocatable all of its two CPUs):
    # those outside pods (this test's own, at the root) are beyond their entitlement
    # beside the starved pods (node_group:procdelta_cpu_over_entitlement:rate5m)
    lines += [
        "# TYPE kube_node_status_capacity gauge",
        f'kube_node_status_capacity{{node="{NODE}",resource="cpu",unit="core"}} 2',
        "# TYPE kube_node_status_allocatable gauge",
        f'kube_node_status_allocatable{{node="{NODE}",resource="cpu",unit="core"}} 2',
    ]
    labels = owner.format("Deployment", "web", "true")
    no_owner = owner.format("", "", "")
    lines += [
        "# TYPE kube_replicaset_owner gauge",
        f'kube_replicaset_owner{{namespace="e2e",replicaset="web-5d8c9b7f4",{labels}}} 1',
        f'kube_replicaset_owner{{namespace="elsewhere",replicaset="legacy-5c9f8",{no_owner}}} 1',
        "# TYPE kube_job_owner gauge",
        f'kube_job_owner{{namespace="elsewhere",job_name="backfill",{no_owner}}} 1',
        "",
    ]
    return "\n".join(lines).replace("'", '"').encode()


@pytest.fixture(scope="module")
def kube_state_metrics(busy_pod):
    """A static page of kube-state-metrics' series, served on loopback."""
    _, uid, _ = busy_pod
    page = kube_state_metrics_page(uid)

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # killed, not left behind, and said why
            process.kill()
            process.wait()
            try:
                _, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # its stderr held open elsewhere: no tail
                stderr = b""
            tail = stderr.decode(errors="replace")[-2000:]
            raise AssertionError(f"serve did not stop within 10 s of SIGTERM:\n{tail}") from None


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, collector, kube_state_metrics):
    target, _ = collector
    server = Prometheus(
        tmp_path_factory.mktemp("prometheus"),
        [target],
        labels={"node": NODE},
        kube_state_metrics=kube_state_metrics,
    )
    try:
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_and_queries(prometheus, collector):
    _, uid = collector
    pod = f'namespace="e2e",pod="busy-pod",uid="{uid}"'

    up = wait_until(lambda: prometheus.query('up{job="procdelta"} == 1'), 30, "target up")
    assert len(up) == 1

    # Counters, with rate() over them: three of about five busy threads on two cores, more
    # than half a core used.
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
    assert 0.5 < float(cores[0]["value"][1]) < 2.5

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


SHAPES_ELSEWHERE = {
    "node_group:procdelta_cpuset_apart:info": (
        "groups pinned apart from every paged pod: this node's pods share both CPUs"
    ),
}
"""Recording rules whose data needs a shape these pods do not have, each with why; each is
run on that shape by the promtool tests (`test_each_rule_left_out_here_is_tested_elsewhere`)."""


def e2e_rule_queries() -> list[str]:
    left_out = {
        rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("record") in SHAPES_ELSEWHERE
    }
    return [query for query in recording_rule_queries() if query not in left_out]


def test_each_rule_left_out_here_is_tested_elsewhere():
    """A rule left out of the query test below is a rule the promtool tests give the shape
    it needs: its name is an `expr:` with expected samples there."""
    tests = "".join(
        path.read_text() for path in (ROOT / "deploy" / "prometheus").glob("*.test.yml")
    )
    for record in SHAPES_ELSEWHERE:
        assert f"- expr: {record}\n" in tests and f"labels: '{record}{{" in tests, record


@pytest.mark.parametrize("query", dashboard_queries() + e2e_rule_queries(), ids=lambda q: q[:60])
def test_every_dashboard_query_and_recording_rule_returns_data(prometheus, collector, query):
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 4"),
        60,
        "four scrapes of procdelta",
    )
    # a record of records (the node's holders over its starved pods' count) has data a
    # few evaluations after those it reads
    wait_until(lambda: prometheus.query(query), 30, f"data for: {query}")


def test_why_pods_wait_is_on_the_kernels_basis_here(prometheus, collector):
    """This host has cgroup CPU pressure: each e2e pod has the kernel's causes and not the
    interval's split (one basis), and its recorded causes are the kernel's."""
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 4"),
        60,
        "four scrapes of procdelta",
    )
    pods = {"busy-pod", "throttled-pod", *WEB}
    for cause, kernel in (
        ("neighbours", "cpu_stalled_neighbours"),
        ("throttled", "cpu_stalled_throttled"),
        ("own_threads", "cpu_waiting_own_threads"),
    ):
        split = prometheus.query(f'procdelta_run_delay_{cause}_nanos_total{{namespace="e2e"}}')
        assert not {s["metric"]["pod"] for s in split} & pods, cause
        ours = prometheus.query(f'procdelta_{kernel}_nanos_total{{namespace="e2e"}}')
        assert pods <= {s["metric"]["pod"] for s in ours}, cause
        recorded = prometheus.query(
            f'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{{cause="{cause}",namespace="e2e"}}'
        )
        assert pods <= {s["metric"]["pod"] for s in recorded}, cause


def panel_query(title: str, window: str) -> str:
    """The first query of a dashboard panel, its variables set as for "All"."""
    return panel_queries(title, window)[0]


def panel_queries(title: str, window: str, **chosen: str) -> list[str]:
    """The queries of a dashboard panel, its variables set as for "All" or as chosen."""
    model = json.loads((ROOT / "grafana" / "procdelta.json").read_text())
    (panel,) = [p for p in model["panels"] if p["title"] == title]
    return [set_variables(t["expr"], window, **chosen) for t in panel["targets"]]


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
    """The dashboard's two headline panels, which take their rates at query time (over
    RULE_WINDOW here), against the busy pod's threads' schedstat read by the test over the
    same span, ending as the panels are queried."""
    _, _, pid = busy_pod
    window = float(RULE_WINDOW.removesuffix("s"))
    wait_until(
        lambda: prometheus.query(
            f"count_over_time(procdelta_passes_total[{RULE_WINDOW}]) >= {window - 2:g}"
        ),
        60,
        f"a rule window of scrapes of procdelta ({RULE_WINDOW})",
    )
    cores_seen, starvation_seen = kernel_window(pid, window)

    def busy_pod_value(title: str) -> float:
        series = [
            s
            for s in prometheus.query(panel_query(title, RULE_WINDOW))
            if s["metric"].get("pod") == "busy-pod"
        ]
        assert len(series) == 1, series
        return float(series[0]["value"][1])

    cores, starvation = busy_pod_value("Cores used"), busy_pod_value("CPU starvation")
    print(f"busy-pod over {RULE_WINDOW}: cores {cores:.3f} (kernel {cores_seen:.3f}), "
          f"starvation {starvation:.3f} (kernel {starvation_seen:.3f})")  # fmt: skip
    # three of about five busy threads on two CPUs: more than half a core, each thread
    # waiting more than half of its runnable time; scrapes land up to a second off the test's window
    assert cores_seen > 0.5 and 0.15 < starvation_seen < 0.85  # the workload did contend
    assert cores == pytest.approx(cores_seen, rel=0.15)
    assert starvation == pytest.approx(starvation_seen, abs=0.08)


def recorded(prometheus: Prometheus, rule: str, pod: str, **labels: str) -> float:
    """The value Prometheus recorded for a pod with one of the project's rules (`labels`:
    more of its labels, such as a cause)."""
    selector = ",".join(f'{k}="{v}"' for k, v in {**labels, "namespace": "e2e", "pod": pod}.items())
    series = wait_until(
        lambda: prometheus.query(f"{rule}{{{selector}}}"), 60, f"{rule} recorded for {pod}"
    )
    assert len(series) == 1, series
    return float(series[0]["value"][1])


def of_pod(prometheus: Prometheus, query: str, pod: str) -> float:
    """A dashboard query's value for one e2e pod."""
    series = [s for s in prometheus.query(query) if s["metric"].get("pod") == pod]
    assert len(series) == 1, (query, series)
    return float(series[0]["value"][1])


def pending(prometheus: Prometheus, alert: str) -> set[str]:
    """The pods for which an alert of the rule file is pending (its `for` not yet over)."""
    return {
        s["metric"]["pod"]
        for s in prometheus.query(f'ALERTS{{alertname="{alert}",namespace="e2e"}}')
    }


def test_rules_tell_the_throttled_pod_from_the_contended_one(prometheus, collector):
    """A real Prometheus evaluates the rule file on what the collector scraped from the
    kernel: the throttled pod's wait is its quota's, the one-thread web pods' their
    neighbours', and busy-pod's (three threads on two CPUs) mostly its own threads'."""
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
        90,
        "25 scrapes of procdelta (the rules' windows full)",
    )
    web = next(iter(WEB))
    share = "node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m"
    assert recorded(prometheus, share, "throttled-pod") > 0.5
    assert not prometheus.query(f'{share}{{pod="busy-pod"}}')  # no quota: no share at all
    # the dashboard's starvation and coverage, at query time over the counters
    starvation = panel_query("CPU starvation", RULE_WINDOW)
    assert of_pod(prometheus, starvation, "throttled-pod") > 0.5  # its run delay: its quota
    assert of_pod(prometheus, starvation, "busy-pod") > 0.25  # 3 threads, 2 CPUs
    wait = "node_namespace_pod:procdelta_cpu_wait:ratio_rate5m"
    assert recorded(prometheus, wait, "throttled-pod", cause="throttled") > 0.5
    assert recorded(prometheus, wait, "throttled-pod", cause="neighbours") < 0.25
    assert recorded(prometheus, wait, web, cause="neighbours") > 0.25
    assert recorded(prometheus, wait, "busy-pod", cause="own_threads") > 0.2
    cores = "node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m"
    assert recorded(prometheus, cores, "throttled-pod") > 0.1e9
    coverage_panel = "Coverage: on-CPU seen by the sums / the cgroup's CPU"
    coverage = of_pod(prometheus, panel_query(coverage_panel, RULE_WINDOW), "busy-pod")
    assert 0.9 < coverage < 1.1  # one long-lived process: the sums see all of its CPU

    def both_pending() -> bool:
        return "throttled-pod" in pending(prometheus, "ProcdeltaPodCPUThrottled") and (
            web in pending(prometheus, "ProcdeltaPodCPUStarved")
        )

    wait_until(both_pending, 60, "the throttled and the starvation alerts pending")
    assert "busy-pod" not in pending(prometheus, "ProcdeltaPodCPUThrottled")
    assert "throttled-pod" not in pending(prometheus, "ProcdeltaPodCPUStarved")


def by_workload(series: list[dict]) -> dict[str, float]:
    return {s["metric"]["workload"]: float(s["value"][1]) for s in series}


def test_workloads_their_findings_and_alerts(prometheus, collector):
    """The workload map from kube-state-metrics' series beside procdelta's real page, the
    sums and the pods each finding covers, and one alert per workload: Deployment web (two
    contended pods) starved, StatefulSet throttled (one pod under its quota) throttled."""
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
        90,
        "25 scrapes of procdelta (the rules' windows full)",
    )
    owners = {
        s["metric"]["pod"]: (s["metric"]["workload"], s["metric"]["workload_type"])
        for s in prometheus.query(
            'namespace_workload_pod:procdelta_pod_owner:relabel{namespace="e2e"}'
        )
    }
    assert owners == {
        **dict.fromkeys(WEB, ("web", "deployment")),
        "throttled-pod": ("throttled", "statefulset"),
        "busy-pod": ("busy-pod", "barepod"),
    }
    e2e = '{namespace="e2e"}'
    title = "Workloads: pods affected, starvation, throttled share, cores"
    pods, _, _, starvation, share, cores = (
        by_workload(prometheus.query(q)) for q in panel_queries(title, RULE_WINDOW, namespace="e2e")
    )
    assert pods == {"web": 2, "throttled": 1, "busy-pod": 1}
    starved = by_workload(
        prometheus.query(f"namespace_workload:procdelta_pods_cpu_starved:ratio{e2e}")
    )
    throttled = by_workload(
        prometheus.query(f"namespace_workload:procdelta_pods_cpu_throttled:ratio{e2e}")
    )
    assert starved["web"] == 1 and throttled["web"] == 0  # both pods wait for CPUs others hold
    assert starved["throttled"] == 0 and throttled["throttled"] == 1  # its own quota
    assert set(share) == {"throttled"} and share["throttled"] > 0.5  # no quota, no share
    assert starvation["web"] > 0.25
    assert cores["busy-pod"] > cores["web"] > 0.2 and cores["throttled"] < 0.3

    def alerts(name: str) -> list[dict]:
        return [
            s["metric"] for s in prometheus.query(f'ALERTS{{alertname="{name}",namespace="e2e"}}')
        ]

    def raised() -> bool:
        return any(a["workload"] == "web" for a in alerts("ProcdeltaWorkloadCPUStarved")) and any(
            a["workload"] == "throttled" for a in alerts("ProcdeltaWorkloadCPUThrottled")
        )

    wait_until(raised, 60, "the workload alerts pending")
    web = [a for a in alerts("ProcdeltaWorkloadCPUStarved") if a["workload"] == "web"]
    assert len(web) == 1 and web[0]["workload_type"] == "deployment"  # one, for two pods
    assert "throttled" not in {a["workload"] for a in alerts("ProcdeltaWorkloadCPUStarved")}
    assert {a["workload"] for a in alerts("ProcdeltaWorkloadCPUThrottled")} == {"throttled"}
    # the pods' own alerts carry their workload and node, for Alertmanager to inhibit them
    wait_until(
        lambda: {a["pod"] for a in alerts("ProcdeltaPodCPUStarved")} >= set(WEB),
        60,
        "web's pods' starvation alerts pending",
    )
    for alert in alerts("ProcdeltaPodCPUStarved"):
        if alert["pod"] in WEB:
            assert (alert["workload"], alert["workload_type"]) == ("web", "deployment")
            assert alert["node"] == NODE


def test_workload_panels_show_the_starved_workload_not_the_throttled_one(prometheus):
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 25"),
        90,
        "25 scrapes of procdelta",
    )
    title = "Workloads: pods affected, starvation, throttled share, cores"
    pods, starved, pods_throttled, starvation, share, cores = (
        by_workload(prometheus.query(q)) for q in panel_queries(title, "10s", namespace="e2e")
    )
    assert pods == {"web": 2, "throttled": 1, "busy-pod": 1}
    assert starved["web"] == 2 and starved["throttled"] == 0
    assert pods_throttled["throttled"] == 1 and pods_throttled["web"] == 0
    assert starvation["web"] > 0.25 and set(share) == {"throttled"}
    assert cores["busy-pod"] > cores["web"]
    shares = panel_queries(
        "Workload pods starved and throttled (share of its pods)", "10s", namespace="e2e"
    )
    starved, throttled = (by_workload(prometheus.query(q)) for q in shares)
    assert starved["web"] == 1 and starved["throttled"] == 0
    assert throttled["throttled"] == 1 and throttled["web"] == 0
    # a workload chosen: its series only
    (chosen,) = panel_queries("Workload CPU starvation", "10s", namespace="e2e", workload="web")
    assert set(by_workload(prometheus.query(chosen))) == {"web"}


def test_neighbours_rank_the_contending_pod_first(prometheus):
    """For one of web's starved pods, the neighbours panel ranks the pods of its node by
    the CPU they used: busy-pod (three busy threads) first; the node is saturated."""
    wait_until(
        lambda: prometheus.query("count_over_time(procdelta_passes_total[1m]) >= 15"),
        90,
        "15 scrapes of procdelta",
    )
    starved_pod = next(iter(WEB))
    title = "Neighbours: cores used per pod on the selected nodes"
    pods, outside = panel_queries(title, "10s", pod=starved_pod)
    ranked = sorted(prometheus.query(pods), key=lambda s: -float(s["value"][1]))
    names = [s["metric"]["pod"] for s in ranked if s["metric"].get("namespace") == "e2e"]
    assert names[0] == "busy-pod", ranked
    assert set(names) == {"busy-pod", "throttled-pod", *WEB}
    assert {s["metric"]["node"] for s in ranked} == {NODE}
    assert [s["metric"]["node"] for s in prometheus.query(outside)] == [NODE]
    # the recorded per-node ranking says the same
    recorded = prometheus.query(
        "sort_desc(node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m"
        f'{{node="{NODE}",namespace="e2e"}})'
    )
    assert recorded[0]["metric"]["pod"] == "busy-pod"
    # a workload chosen: its pods' node; a pod no node ran: no neighbours at all
    (by_web, _) = panel_queries(title, "10s", workload="web")
    assert {s["metric"].get("pod") for s in prometheus.query(by_web)} >= set(WEB)
    for query in panel_queries(title, "10s", pod="no-such-pod"):
        assert prometheus.query(query) == []
    title = "Node saturation: starved pods, runnable threads per CPU"
    starved, saturation, starvation = (
        prometheus.query(q) for q in panel_queries(title, "10s", pod=starved_pod)
    )
    # web's two pods wait for busy-pod's threads, moment by moment
    assert len(starved) == 1 and float(starved[0]["value"][1]) >= 2
    # about five busy threads on two CPUs (procdelta's own count of them: no capacity series
    # of kube-state-metrics here)
    assert len(saturation) == 1 and float(saturation[0]["value"][1]) > 1.5
    assert len(starvation) == 1 and float(starvation[0]["value"][1]) > 0.25

"""The chart's rules in a real Prometheus at the chart's own group intervals (promtool's unit
tests evaluate every group at the file's one `evaluation_interval`): the per-pod records,
the workload map and the alerts on the findings every minute (`podInterval`,
`workloadInterval`), the node rules and procdelta's own alerts at kube-prometheus-stack's
30 s, over pages shaped as procdelta and kube-state-metrics serve them. The shapes are
deploy/prometheus/procdelta.owed.rules.test.yml's: a pod starved within its request (its
node pages), a BestEffort pod starved beside a database at its request (no page), a pod
starved on the interval's basis (no page), each pod's own alert as context. The alerts'
`for` is set to 0 (the group intervals are what is tested, not the durations), so the
run takes about two of the slowest group's minutes."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import yaml

from tests.integration.test_helm import generate
from tests.net import wait_until
from tests.tools.rulecost import _get, prometheus, query

SECOND = 1e9  # ns: a counter rising this much a second is one core

# (node, namespace, pod, qos, per-second rates of the counters procdelta exports)
PODS = [
    # o1: a Guaranteed pod requesting 4 cores held to 2.5 (0.5 of the time it had work
    # behind others) by an agent outside pods: owed, its node pages
    ("o1", "shop", "api-0", "guaranteed", {
        "cgroup_cpu_nanos": 2.5, "cpu_pressure_stalled_nanos": 0.5,
        "cpu_stalled_neighbours_nanos": 0.5, "cpu_stalled_throttled_nanos": 0,
        "cpu_waiting_own_threads_nanos": 0}),
    # b1: a database at its 14-core request, and a BestEffort pod starved 0.6 beside it
    ("b1", "shop", "db-0", "guaranteed", {"cgroup_cpu_nanos": 14}),
    ("b1", "batch", "crunch", "besteffort", {
        "cgroup_cpu_nanos": 1.5, "cpu_pressure_stalled_nanos": 0.6,
        "cpu_stalled_neighbours_nanos": 0.6, "cpu_stalled_throttled_nanos": 0,
        "cpu_waiting_own_threads_nanos": 0}),
    # v1: no CPU pressure; the interval's averages give a pod within its request its
    # neighbours' wait, 0.5 of its runnable time: context only
    ("v1", "shop", "pair-a", "burstable", {
        "cgroup_cpu_nanos": 1, "run_delay_neighbours_nanos": 1, "run_delay_own_threads_nanos": 0,
        "run_delay_throttled_nanos": 0, "run_delay_runnable_nanos": 2}),
]  # fmt: skip
REQUESTS = {("shop", "api-0"): 4, ("shop", "db-0"): 14, ("shop", "pair-a"): 1}
OUTSIDE = {"o1": 5.0}  # cores used by processes outside pods


class Pages:
    """Every node's procdelta page and kube-state-metrics', on one loopback server; the
    counters rise at their rates from ten minutes before the server started, and
    `history()` gives the samples a scrape would have taken since (the rules' 5-minute
    rates read low over a window their samples only partly fill)."""

    def __init__(self) -> None:
        epoch = self.epoch = time.time() - 600
        pages = {f"/nodes/{n}/metrics": self._node(n) for n in {p[0] for p in PODS}}
        pages["/kube-state-metrics/metrics"] = self._ksm()
        self.pages = pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                lines = pages.get(self.path)
                if lines is None:
                    self.send_error(404)
                    return
                elapsed = time.time() - epoch
                body = "".join(
                    f"{series} {int(rate * elapsed) if counter else rate}\n"
                    for series, rate, counter in lines
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _node(node: str) -> list[tuple[str, float, bool]]:
        lines = []
        for where, namespace, pod, qos, rates in PODS:
            if where != node:
                continue
            labels = f'namespace="{namespace}",pod="{pod}",uid="u-{pod}",qos="{qos}"'
            lines += [
                (f"procdelta_{field}_total{{{labels}}}", rate * SECOND, True)
                for field, rate in rates.items()
            ]
        if node in OUTSIDE:
            cgroup = 'cgroup="/system.slice/agent.service"'
            lines.append(
                (f"procdelta_on_cpu_nanos_total{{{cgroup}}}", OUTSIDE[node] * SECOND, True)
            )
        lines.append(("procdelta_passes_total", 1 / 15, True))
        return lines

    @staticmethod
    def _ksm() -> list[tuple[str, float, bool]]:
        return [
            (
                f'kube_pod_container_resource_requests{{namespace="{ns}",pod="{pod}",'
                f'uid="u-{pod}",container="app",resource="cpu",unit="core"}}',
                cores,
                False,
            )
            for (ns, pod), cores in REQUESTS.items()
        ]

    def history(self, step: float = 15.0) -> str:
        """OpenMetrics text of every series as scraped (the targets' labels added) every
        `step` seconds from the epoch to a few seconds ago."""
        lines: list[str] = []
        now = time.time()
        for path, series in self.pages.items():
            if path.startswith("/nodes/"):
                node = path.split("/")[2]
                target = f'cluster="synthetic",job="procdelta",instance="{node}:9746",node="{node}"'
            else:
                target = (
                    'cluster="synthetic",job="kube-state-metrics",'
                    'instance="kube-state-metrics:8080"'
                )
            for name, rate, counter in series:
                metric, _, labels = name.partition("{")
                labels = labels.rstrip("}")
                joined = f"{labels},{target}" if labels else target
                at = self.epoch + step
                while at < now - 5:
                    value = int(rate * (at - self.epoch)) if counter else rate
                    lines.append(f"{metric}{{{joined}}} {value} {at:.3f}")
                    at += step
        return "\n".join(lines) + "\n# EOF\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class Fleet:
    """What tests.tools.rulecost's `prometheus` scrapes: a target a node, kube-state-metrics."""

    def __init__(self) -> None:
        self.nodes = sorted({p[0] for p in PODS})


def rules(tmp_path: Path) -> Path:
    """The chart's PrometheusRule with its group intervals as they are, every finding
    alert's `for` 0."""
    alerts = {
        name: {"for": "0s"}
        for name in ("nodeCPUSaturated", "podCPUStarved", "workloadCPUStarved",
                     "workloadStarvingNodes", "podCPUThrottled", "podCPUOwnThreads",
                     "workloadCPUThrottled")
    }  # fmt: skip
    rendered = generate.render({"prometheusRule": {"enabled": True, "alerts": alerts}})
    spec = yaml.safe_load(rendered["prometheusrule.yaml"])["spec"]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Args:
    scrape_interval = 5.0
    evaluation_interval = 30.0  # kube-prometheus-stack's


def firing(url: str) -> set[tuple[str, str]]:
    return {
        (a["metric"]["alertname"], a["metric"].get("pod") or a["metric"].get("node", ""))
        for a in query(url, 'ALERTS{alertstate="firing"}')
        if a["metric"]["alertname"].startswith("ProcdeltaNode")
        or a["metric"]["alertname"] == "ProcdeltaPodCPUStarved"
    }


def test_the_rules_at_the_charts_group_intervals_page_only_for_owed_pods(tmp_path):
    path = rules(tmp_path)
    groups = {g["name"]: g.get("interval") for g in yaml.safe_load(path.read_text())["groups"]}
    assert groups["procdelta.pod.rules"] == groups["procdelta.alerts"] == "1m"
    assert groups["procdelta.workload.rules"] == "1m" and groups["procdelta.node.rules"] is None
    pages = Pages()
    expected = {
        ("ProcdeltaNodeCPUSaturated", "o1"),
        ("ProcdeltaPodCPUStarved", "api-0"),
        ("ProcdeltaPodCPUStarved", "crunch"),
        ("ProcdeltaPodCPUStarved", "pair-a"),
    }
    try:
        with prometheus(path, Fleet(), pages.port, Args(), pages.history()) as url:
            wait_until(lambda: firing(url) >= expected, 300, "the alerts at the groups' pace")
            # every shape is there from the start: no other page comes later than these
            assert firing(url) == expected
            served = json.loads(_get(f"{url}/api/v1/rules"))["data"]["groups"]
            intervals = {g["name"]: g["interval"] for g in served}
            assert intervals["procdelta.pod.rules"] == 60
            assert intervals["procdelta.node.rules"] == 30
            paged = query(url, "node_namespace_pod:procdelta_cpu_starved_paged:ratio_rate5m")
            assert [(p["metric"]["node"], p["metric"]["pod"]) for p in paged] == [("o1", "api-0")]
    finally:
        pages.close()

"""What procdelta's rule groups cost a Prometheus that scrapes a fleet.

A synthetic fleet of N nodes x P pods is served on 127.0.0.1 by one small HTTP server:
one procdelta page per node (every per-group family of docs/reference.md §5 and §7, and
the three `run_delay_*` parts of the run delay, for each pod, with `namespace`, `pod`,
`uid`, `qos`; counters that grow between scrapes; a share of the pods with CPU quotas,
some of them throttled, some starved by neighbours; a few processes outside pods as
`cgroup` groups; the collector's own metrics), and one kube-state-metrics page with the
owner series the workload map joins (`kube_pod_owner`, `kube_replicaset_owner`,
`kube_job_owner`) and `kube_pod_info`. Prometheus tells the targets apart by
`__metrics_path__`, set per target in its static configuration with the node's `node`
and `instance`, and a `cluster` label on every target.

For each rule file, Debian's `prometheus` (the binary on PATH) is started on loopback
with a fresh TSDB, a short scrape and evaluation interval and that file, left to fill its
rate windows (`--warmup`), and then read, evaluation after evaluation, from its own
metrics only: `prometheus_rule_group_last_duration_seconds` (each group's evaluation time),
`prometheus_rule_group_last_evaluation_samples` (the samples each group writes),
`prometheus_tsdb_head_series`, and the CPU the server used meanwhile (a run without rules,
`--baseline`, is read the same way); after that span, the rules API for each rule's own
evaluation time and health (a rule that fails costs nothing: its file's result would be
void, so the run says so). The rules API is not read during the span: it renders every
active alert at each call, a cost of the reading that would be counted as the rules'.
Rule files given together are run alternately, round after round, on the same pages;
medians over the evaluations of every round, and the ratio of each round's totals to the
first file's of the same round.

    python -m tests.tools.rulecost --nodes 20 --pods 110 \\
        --rules before=/tmp/rules-before.yml --rules after=deploy/prometheus/procdelta.rules.yml

Each rule file's range selections of raw `procdelta_*` series are counted from its text
(`raw_selections`): what every evaluation has to decode, whatever the fleet.
Every process and temporary directory the run makes is removed when it ends, also on
an error or a signal. Not part of the tests: it takes minutes, and prints numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import math
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests import spec
from tests.net import free_port, stop_process

PASS_SECONDS = 15
"""The collector's default interval: each interval gauge holds this many seconds' worth."""

PROCESS_FIELDS = tuple(spec.FIELDS)
"""docs/reference.md §3."""
CGROUP_FIELDS = (
    "cgroup_cpu_nanos", "cpu_periods", "cpu_throttled_periods", "cpu_throttled_nanos",
    "cpu_pressure_waiting_nanos", "cpu_pressure_stalled_nanos",
    "memory_pressure_waiting_nanos", "memory_pressure_stalled_nanos",
    "io_pressure_waiting_nanos", "io_pressure_stalled_nanos",
)  # fmt: skip
"""docs/reference.md §7."""
WAIT_CAUSES = (
    "cpu_stalled_throttled_nanos", "cpu_waiting_own_threads_nanos", "cpu_stalled_neighbours_nanos",
)  # fmt: skip
"""Why a pod waited, from its cgroup's CPU pressure (wall time): its own quota, its own
threads, its neighbours. The fleet's nodes have cgroup PSI, so no group there has the
interval's split of its run delay (`run_delay_*`), the basis of nodes without."""
BANDWIDTH_FIELDS = frozenset({"cpu_periods", "cpu_throttled_periods", "cpu_throttled_nanos"})
"""Only groups under a CPU quota have these."""

GROUP_FIELDS = PROCESS_FIELDS + CGROUP_FIELDS + WAIT_CAUSES
FOOTPRINT = ("processes", "threads", "rss_bytes")
HELP = "Synthetic page of tests/tools/rulecost.py"


# --- the fleet -------------------------------------------------------------------------


@dataclass
class Group:
    """One group of a node's page: its label text and its fields' per-second slopes."""

    labels: str  # '{namespace="..",pod="..",uid="..",qos=".."}' or '{cgroup=".."}'
    rates: dict[str, float]  # field -> per second (processes: a count)
    footprint: tuple[int, int, int]
    started: float  # seconds of counting before the fleet's epoch


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    qos: str
    node: int
    owner_kind: str  # kube_pod_owner's: ReplicaSet, StatefulSet, DaemonSet, Job, Node, ""
    owner_name: str


@dataclass
class Fleet:
    nodes: list[str]
    groups: list[list[Group]]  # per node
    pods: list[Pod]
    replicasets: dict[tuple[str, str], str] = field(default_factory=dict)  # -> Deployment
    jobs: dict[tuple[str, str], str] = field(default_factory=dict)  # -> CronJob ("": none)
    epoch: float = field(default_factory=time.time)


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


DAEMONSETS = (("kube-system", "kube-proxy"), ("monitoring", "node-exporter"),
              ("procdelta", "procdelta"))  # fmt: skip
SYSTEM_CGROUPS = (
    "/", "/init.scope", "/system.slice/kubelet.service", "/system.slice/containerd.service",
    "/system.slice/systemd-journald.service", "/system.slice/ssh.service",
    "/user.slice/user-0.slice/session-1.scope",
)  # fmt: skip


def make_fleet(nodes: int, pods: int, seed: int = 30) -> Fleet:
    """N nodes of P pods each: per node the DaemonSets' pods, the rest from Deployments
    (through ReplicaSets), StatefulSets, CronJobs' and bare Jobs, and bare pods, each
    workload's replicas spread over the nodes; a static pod on the first node."""
    rng = random.Random(seed)
    node_names = [f"node-{i:03d}" for i in range(nodes)]
    fleet = Fleet(node_names, [[] for _ in range(nodes)], [])
    for n in range(nodes):
        for namespace, daemonset in DAEMONSETS:
            fleet.pods.append(Pod(namespace, f"{daemonset}-{_suffix(rng)}", _uid(rng),
                                  "burstable", n, "DaemonSet", daemonset))  # fmt: skip
    if nodes and pods > len(DAEMONSETS):
        static_uid = rng.getrandbits(128).to_bytes(16).hex()  # a static pod's: 32 hex digits
        fleet.pods.append(Pod("kube-system", f"etcd-{node_names[0]}", static_uid, "burstable",
                              0, "Node", node_names[0]))  # fmt: skip
    free = [pods - sum(p.node == n for p in fleet.pods) for n in range(nodes)]
    slots = [n for n in range(nodes) for _ in range(max(0, free[n]))]
    rng.shuffle(slots)
    index = 0
    while index < len(slots):
        namespace = f"team-{rng.randrange(20):02d}"
        app = f"app-{index:05d}"
        kind = rng.choices(["deployment", "statefulset", "cronjob", "job", "bare"],
                           [70, 12, 8, 3, 7])[0]  # fmt: skip
        replicas = {"bare": [1], "cronjob": [1, 1, 2], "job": [1, 2, 4]}.get(
            kind, [1, 2, 3, 3, 5, 8, 12, 20]
        )
        replicas = rng.choice(replicas)
        replicas = min(replicas, len(slots) - index)
        qos = rng.choices(["guaranteed", "burstable", "besteffort"], [20, 65, 15])[0]
        if kind == "deployment":
            replicaset = f"{app}-{_suffix(rng, 9)}"
            fleet.replicasets[(namespace, replicaset)] = app
            names = [(f"{replicaset}-{_suffix(rng)}", "ReplicaSet", replicaset)
                     for _ in range(replicas)]  # fmt: skip
        elif kind == "statefulset":
            names = [(f"{app}-{i}", "StatefulSet", app) for i in range(replicas)]
        elif kind in ("cronjob", "job"):
            job = f"{app}-{rng.randrange(28_000_000, 29_000_000)}" if kind == "cronjob" else app
            fleet.jobs[(namespace, job)] = app if kind == "cronjob" else ""
            names = [(f"{job}-{_suffix(rng)}", "Job", job) for _ in range(replicas)]
        else:
            names = [(app, "", "")]
        for name, owner_kind, owner in names:
            fleet.pods.append(Pod(namespace, name, _uid(rng), qos, slots[index], owner_kind,
                                  owner))  # fmt: skip
            index += 1
    for pod in fleet.pods:
        labels = (f'{{namespace="{pod.namespace}",pod="{pod.name}",uid="{pod.uid}",'
                  f'qos="{pod.qos}"}}')  # fmt: skip
        fleet.groups[pod.node].append(_pod_group(rng, labels, pod.qos))
    for n in range(nodes):
        for path in SYSTEM_CGROUPS:
            fleet.groups[n].append(_cgroup_group(rng, path))
    return fleet


def _pod_group(rng: random.Random, labels: str, qos: str) -> Group:
    """A pod's slopes: how busy it is, how much it waits and why."""
    cores = rng.choices([0.001, 0.01, 0.05, 0.2, 0.6, 1.5], [25, 30, 20, 15, 7, 3])[0]
    quota = qos == "guaranteed" or (qos == "burstable" and rng.random() < 0.4)
    profile = rng.choices(["quiet", "starved", "throttled", "own_threads", "short_lived"],
                          [80, 6, 6 if quota else 0, 3, 5])[0]  # fmt: skip
    on_cpu = cores * 1e9
    delay_share, parts = {
        "quiet": (0.03, (0.0, 0.1, 0.5)),
        "starved": (0.6, (0.0, 0.1, 0.8)),
        "throttled": (1.2, (0.9, 0.0, 0.05)),
        "own_threads": (0.5, (0.0, 0.8, 0.1)),
        "short_lived": (0.05, (0.0, 0.1, 0.5)),
    }[profile]
    if profile in ("starved", "throttled", "own_threads"):
        cores = max(cores, 0.2)
        on_cpu = cores * 1e9
    run_delay = on_cpu * delay_share
    waiting = min(0.95e9, run_delay * 0.8)  # wall time some task waited (PSI `some`)
    processes = rng.randint(1, 6)
    cgroup_cpu = on_cpu * (2.5 if profile == "short_lived" else 1.02)
    rates = {
        "processes": processes,
        "observed_nanos": processes * 1e9,
        "on_cpu_nanos": on_cpu,
        "run_delay_nanos": run_delay,
        "cpu_user_nanos": on_cpu * 0.75,
        "cpu_system_nanos": on_cpu * 0.25,
        "major_faults": rng.choice([0.0, 0.0, 0.01, 0.5]),
        "voluntary_switches": 20 + cores * rng.uniform(500, 5000),
        "nonvoluntary_switches": 1 + cores * 100 + run_delay / 1e7,
        "read_bytes": rng.choice([0.0, 4096.0, 1e5, 5e6]),
        "write_bytes": rng.choice([0.0, 8192.0, 2e5, 1e7]),
        "cgroup_cpu_nanos": cgroup_cpu,
        "cpu_pressure_waiting_nanos": waiting,
        "cpu_pressure_stalled_nanos": waiting * (parts[0] + parts[2]) / sum(parts),
        "memory_pressure_waiting_nanos": rng.choice([0.0, 0.0, 1e5, 2e7]),
        "memory_pressure_stalled_nanos": 0.0,
        "io_pressure_waiting_nanos": rng.choice([0.0, 1e5, 1e6, 5e7]),
        "io_pressure_stalled_nanos": rng.choice([0.0, 1e5]),
        # each moment some task waited to one cause: its quota, its own threads, the rest
        **{
            cause: waiting * part / sum(parts)
            for cause, part in zip(WAIT_CAUSES, parts, strict=True)
        },
    }
    if quota:
        periods = 10 * min(1.0, 0.05 + cores * 4)
        throttled = periods * (0.7 if profile == "throttled" else rng.choice([0.0, 0.01, 0.05]))
        rates |= {
            "cpu_periods": periods,
            "cpu_throttled_periods": throttled,
            "cpu_throttled_nanos": max(run_delay * parts[0], throttled * 2e7),
        }
    footprint = (processes, processes * rng.randint(1, 20), processes * rng.randint(5, 300) << 20)
    return Group(labels, rates, footprint, rng.uniform(3600, 10 * 86400))


def _cgroup_group(rng: random.Random, path: str) -> Group:
    """Processes outside pods: a node's system services (the root has no cgroup fields)."""
    cores = {"/": 0.02, "/system.slice/kubelet.service": 0.08,
             "/system.slice/containerd.service": 0.05}.get(path, 0.003)  # fmt: skip
    processes = 30 if path == "/" else rng.randint(1, 4)
    run_delay = cores * 1e9 * 0.05
    rates = {
        "processes": processes,
        "observed_nanos": processes * 1e9,
        "on_cpu_nanos": cores * 1e9,
        "run_delay_nanos": run_delay,
        "cpu_user_nanos": cores * 0.6e9,
        "cpu_system_nanos": cores * 0.4e9,
        "major_faults": 0.0,
        "voluntary_switches": 50 + cores * 4000,
        "nonvoluntary_switches": 2 + cores * 200,
        "read_bytes": 1e3,
        "write_bytes": 5e4,
    }
    if path != "/":
        rates |= {
            "cgroup_cpu_nanos": cores * 1.05e9,
            "cpu_pressure_waiting_nanos": run_delay * 0.8,
            "cpu_pressure_stalled_nanos": run_delay * 0.2,
            "memory_pressure_waiting_nanos": 0.0,
            "memory_pressure_stalled_nanos": 0.0,
            "io_pressure_waiting_nanos": 1e6,
            "io_pressure_stalled_nanos": 1e5,
            "run_delay_throttled_nanos": 0.0,
            "run_delay_own_threads_nanos": run_delay * 0.1,
            "run_delay_neighbours_nanos": run_delay * 0.6,
        }
    footprint = (processes, processes * 3, processes * 20 << 20)
    return Group(f'{{cgroup="{path}"}}', rates, footprint, rng.uniform(3600, 10 * 86400))


# --- the pages -------------------------------------------------------------------------

Series = list[tuple[str, float, float]]  # (line up to the value, value at epoch, slope)


def _family(name: str, kind: str, series: Series) -> tuple[str, Series]:
    return f"# HELP {name} {HELP}.\n# TYPE {name} {kind}\n", series


def node_families(fleet: Fleet, node: int) -> list[tuple[str, Series]]:
    """A node's page as families of series, in the collector's order: interval gauges,
    counters, footprint, then the collector's own metrics."""
    groups = fleet.groups[node]
    families = [
        _family(f"procdelta_interval_{f}", "gauge",
                [(f"procdelta_interval_{f}{g.labels} ", round(g.rates[f] * (
                    1 if f == "processes" else PASS_SECONDS)), 0.0)
                 for g in groups if f in g.rates])
        for f in GROUP_FIELDS
    ]  # fmt: skip
    families += [
        _family(f"procdelta_{f}_total", "counter",
                [(f"procdelta_{f}_total{g.labels} ", g.rates[f] * g.started, g.rates[f])
                 for g in groups if f in g.rates])
        for f in GROUP_FIELDS if f != "processes"
    ]  # fmt: skip
    families += [
        _family(f"procdelta_footprint_{f}", "gauge",
                [(f"procdelta_footprint_{f}{g.labels} ", g.footprint[i], 0.0) for g in groups])
        for i, f in enumerate(FOOTPRINT)
    ]  # fmt: skip
    # every group on every CPU of the node (no CPU manager): `all`
    families.append(
        _family("procdelta_cpuset_cpus", "gauge",
                [(f"procdelta_cpuset_cpus{g.labels[:-1]},cpus=\"all\"}} ", 16, 0.0)
                 for g in groups])
    )  # fmt: skip
    # and so no list but `all`: no CPU of a list
    families.append(_family("procdelta_cpuset_member", "gauge", []))
    passes = 1 / PASS_SECONDS
    up = 86400.0 * (1 + node % 7)
    buckets = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
               "1.0", "2.5", "5.0", "10.0", "+Inf"]  # fmt: skip
    share = [0, 0, 0, 0.1, 0.7, 0.97, 1, 1, 1, 1, 1, 1, 1, 1]
    families += [
        _family("procdelta_pass_duration_seconds", "histogram",
                [(f'procdelta_pass_duration_seconds_bucket{{le="{le}"}} ', s * up * passes,
                  s * passes) for le, s in zip(buckets, share, strict=True)]
                + [("procdelta_pass_duration_seconds_sum ", 0.03 * up * passes, 0.03 * passes),
                   ("procdelta_pass_duration_seconds_count ", up * passes, passes)]),
        _family("procdelta_passes_total", "counter",
                [("procdelta_passes_total ", up * passes, passes)]),
        _family("procdelta_failed_passes_total", "counter",
                [("procdelta_failed_passes_total ", 0, 0.0)]),
        _family("procdelta_dropped_deltas_total", "counter",
                [(f'procdelta_dropped_deltas_total{{reason="{r}"}} ', up * s, s)
                 for r, s in (("first_seen", 0.5), ("pid_reused", 0.0), ("counter_fell", 0.0),
                              ("unreadable", 0.0), ("vanished", 0.2), ("unplaced", 0.0))]),
        _family("procdelta_dropped_thread_deltas_total", "counter",
                [(f'procdelta_dropped_thread_deltas_total{{reason="{r}"}} ', up * s, s)
                 for r, s in (("first_seen", 0.1), ("pid_reused", 0.0), ("counter_fell", 0.0))]),
        _family("procdelta_dropped_cgroup_deltas_total", "counter",
                [(f'procdelta_dropped_cgroup_deltas_total{{reason="{r}"}} ', up * s, s)
                 for r, s in (("first_seen", 0.01), ("recreated", 0.0), ("counter_fell", 0.0))]),
        _family("procdelta_tracked_cgroups", "gauge",
                [("procdelta_tracked_cgroups ", len(groups) - 1, 0.0)]),
        _family("procdelta_skipped_processes", "gauge",
                [("procdelta_skipped_processes ", 400, 0.0)]),
        _family("procdelta_tracked_processes", "gauge",
                [("procdelta_tracked_processes ", 600, 0.0)]),
        _family("procdelta_tracked_threads", "gauge",
                [("procdelta_tracked_threads ", 3000, 0.0)]),
        _family("procdelta_node_cpus", "gauge", [("procdelta_node_cpus ", 16, 0.0)]),
        _family("procdelta_source_available", "gauge",
                [(f'procdelta_source_available{{source="{s}"}} ', v, 0.0)
                 for s, v in (("schedstat", 1), ("thread_io", 1), ("cgroup_v2", 1),
                              ("cgroup_v1_cpu", 0), ("cgroup_v1_cpuacct", 0), ("psi", 1),
                              ("cgroup_namespace_root", 1))]),
        _family("procdelta_build_info", "gauge",
                [('procdelta_build_info{version="test"} ', 1, 0.0)]),
        _family("procdelta_interval_seconds", "gauge",
                [("procdelta_interval_seconds ", PASS_SECONDS, 0.0)]),
        _family("procdelta_last_pass_timestamp_seconds", "gauge",
                [("procdelta_last_pass_timestamp_seconds ", None, 0.0)]),  # now, per scrape
        _family("process_cpu_seconds_total", "counter",
                [("process_cpu_seconds_total ", up * 0.002, 0.002)]),
        _family("process_start_time_seconds", "gauge",
                [("process_start_time_seconds ", fleet.epoch - up, 0.0)]),
        _family("process_resident_memory_bytes", "gauge",
                [("process_resident_memory_bytes ", 33 << 20, 0.0)]),
        _family("process_open_fds", "gauge", [("process_open_fds ", 12, 0.0)]),
    ]  # fmt: skip
    return families


def kube_state_metrics_families(fleet: Fleet) -> list[tuple[str, Series]]:
    """kube-state-metrics' series the workload map reads, each pod's info, and its CPU
    requests (one container a pod, two for every third) that the node's page reads."""
    owners, info, requests = [], [], []
    for index, pod in enumerate(fleet.pods):
        for container in ("app", "sidecar")[: 1 + (index % 3 == 0)]:
            requests.append((
                f'kube_pod_container_resource_requests{{namespace="{pod.namespace}",'
                f'pod="{pod.name}",uid="{pod.uid}",container="{container}",'
                f'node="{fleet.nodes[pod.node]}",resource="cpu",unit="core"}} ',
                0.1 * (1 + index % 5), 0.0))  # fmt: skip
        controller = "true" if pod.owner_kind else "false"
        owners.append((
            f'kube_pod_owner{{namespace="{pod.namespace}",pod="{pod.name}",uid="{pod.uid}",'
            f'owner_kind="{pod.owner_kind}",owner_name="{pod.owner_name}",'
            f'owner_is_controller="{controller}"}} ', 1, 0.0))  # fmt: skip
        info.append((
            f'kube_pod_info{{namespace="{pod.namespace}",pod="{pod.name}",uid="{pod.uid}",'
            f'host_ip="10.0.{pod.node // 250}.{pod.node % 250}",node="{fleet.nodes[pod.node]}",'
            f'created_by_kind="{pod.owner_kind}",created_by_name="{pod.owner_name}",'
            f'priority_class="",host_network="false"}} ', 1, 0.0))  # fmt: skip
    replicasets = [
        (f'kube_replicaset_owner{{namespace="{ns}",replicaset="{rs}",owner_kind="Deployment",'
         f'owner_name="{deployment}",owner_is_controller="true"}} ', 1, 0.0)
        for (ns, rs), deployment in sorted(fleet.replicasets.items())
    ]  # fmt: skip
    jobs = [
        (f'kube_job_owner{{namespace="{ns}",job_name="{job}",'
         f'owner_kind="{"CronJob" if cron else ""}",owner_name="{cron}",'
         f'owner_is_controller="{"true" if cron else "false"}"}} ', 1, 0.0)
        for (ns, job), cron in sorted(fleet.jobs.items())
    ]  # fmt: skip
    return [
        _family("kube_pod_owner", "gauge", owners),
        _family("kube_pod_info", "gauge", info),
        _family("kube_replicaset_owner", "gauge", replicasets),
        _family("kube_job_owner", "gauge", jobs),
        _family("kube_pod_container_resource_requests", "gauge", requests),
    ]


def render(families: list[tuple[str, Series]], epoch: float, now: float) -> bytes:
    """The page at `now`: every counter at its value then (integers, as the collector's)."""
    elapsed = now - epoch
    last_pass = now - (now - epoch) % PASS_SECONDS
    parts = []
    for header, series in families:
        parts.append(header)
        for line, base, slope in series:
            value = last_pass if base is None else base + slope * elapsed
            parts.append(f"{line}{value:.3f}\n" if base is None else f"{line}{int(value)}\n")
    return "".join(parts).encode()


class FleetServer:
    """One HTTP server on 127.0.0.1 for every node's page (/nodes/<node>/metrics) and
    kube-state-metrics' (/kube-state-metrics/metrics), rendered afresh on each request."""

    def __init__(self, fleet: Fleet):
        pages = {f"/nodes/{name}/metrics": node_families(fleet, n)
                 for n, name in enumerate(fleet.nodes)}  # fmt: skip
        pages["/kube-state-metrics/metrics"] = kube_state_metrics_families(fleet)
        epoch = fleet.epoch

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                families = pages.get(self.path)
                if families is None:
                    self.send_error(404)
                    return
                body = render(families, epoch, time.time())
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.paths = sorted(pages)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def scrape_config(fleet: Fleet, port: int, cluster: str = "synthetic") -> list[dict]:
    """Prometheus' scrape_configs for the fleet: one target per node, all on `port`."""
    address = [f"127.0.0.1:{port}"]
    return [
        {
            "job_name": "procdelta",
            "static_configs": [
                {"targets": address,
                 "labels": {"__metrics_path__": f"/nodes/{name}/metrics", "node": name,
                            "instance": f"{name}:9746", "cluster": cluster}}
                for name in fleet.nodes
            ],
        },
        {
            "job_name": "kube-state-metrics",
            "static_configs": [
                {"targets": address,
                 "labels": {"__metrics_path__": "/kube-state-metrics/metrics",
                            "instance": "kube-state-metrics:8080", "cluster": cluster}}
            ],
        },
    ]  # fmt: skip


# --- the rule files --------------------------------------------------------------------

RAW_RANGE = re.compile(r"(?<![\w:])(procdelta_\w+)\s*(?:\{[^{}]*\})?\s*\[")
RAW_RATE = re.compile(r"(?<![\w:])rate\(\s*(procdelta_\w+)")


def raw_selections(text: str) -> dict[str, tuple[int, int]]:
    """Per rule group of a rule file: (rate() over a raw procdelta_* series, every range
    selection of one: rate, increase, present_over_time, ...), as written in the file;
    one evaluation of the group makes each of them once."""
    counts = {}
    for group in yaml.safe_load(text)["groups"]:
        exprs = [str(rule["expr"]) for rule in group["rules"]]
        counts[group["name"]] = (
            sum(len(RAW_RATE.findall(e)) for e in exprs),
            sum(len(RAW_RANGE.findall(e)) for e in exprs),
        )
    return counts


# --- one Prometheus run ----------------------------------------------------------------


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


SAMPLE = re.compile(r'^(\w+)(?:\{(?:rule_group="([^"]*)")?[^}]*\})? (\S+)$', re.M)


def read_metrics(url: str) -> dict[str, dict[str, float]]:
    """Prometheus' own /metrics: {name: {rule_group or "": value}} for the names read."""
    wanted = {
        "prometheus_rule_group_last_duration_seconds",
        "prometheus_rule_group_last_evaluation_samples",
        "prometheus_rule_group_last_evaluation_timestamp_seconds",
        "prometheus_rule_group_iterations_missed_total",
        "prometheus_rule_evaluation_failures_total",
        "prometheus_tsdb_head_series",
        "process_cpu_seconds_total",
    }
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for name, group, value in SAMPLE.findall(_get(f"{url}/metrics").decode()):
        if name in wanted:
            key = group.rpartition(";")[2]
            found[name][key] = found[name].get(key, 0.0) + float(value)
    return found


def query(url: str, promql: str) -> list[dict]:
    answer = json.loads(_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@dataclass
class Run:
    label: str
    durations: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    shares: dict[str, float] = field(default_factory=dict)  # evaluations per global one
    samples: dict[str, float] = field(default_factory=dict)
    rules: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    head_series: float = 0
    scraped_series: float = 0
    recorded_series: float = 0
    alert_series: float = 0
    alerts: dict[str, int] = field(default_factory=dict)
    cpu_cores: float = 0
    failures: list[str] = field(default_factory=list)
    missed: float = 0


@contextlib.contextmanager
def prometheus(rules: Path | None, fleet: Fleet, port: int, args, history: str | None = None):
    """Debian's prometheus on a free loopback port, scraping the fleet (served on `port`)
    with the rules (None: none), its TSDB in a directory of its own (with `history`, an
    OpenMetrics text of samples from before it started, written into it as a block by
    `promtool tsdb create-blocks-from openmetrics`); yields its URL once ready. The process
    is stopped and the directory removed on the way out, whatever happened."""
    directory = Path(tempfile.mkdtemp(prefix="rulecost-"))
    process = None
    try:
        if history is not None:
            (directory / "history.om").write_text(history)
            subprocess.run(
                [shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from",
                 "openmetrics", str(directory / "history.om"), str(directory / "data")],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        config = {
            "global": {"scrape_interval": f"{args.scrape_interval:g}s",
                       "scrape_timeout": f"{args.scrape_interval * 0.8:g}s",
                       "evaluation_interval": f"{args.evaluation_interval:g}s"},
            "scrape_configs": scrape_config(fleet, port),
        }  # fmt: skip
        if rules is not None:
            shutil.copy(rules, directory / "rules.yml")
            config["rule_files"] = [str(directory / "rules.yml")]
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        url = f"http://127.0.0.1:{(listen := free_port())}"
        with (directory / "prometheus.log").open("w") as log:
            process = subprocess.Popen(
                [shutil.which("prometheus") or "prometheus",
                 f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{listen}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.time() + 60
        while True:
            with contextlib.suppress(OSError):
                _get(f"{url}/-/ready", timeout=2)
                break
            if process.poll() is not None or time.time() > deadline:
                tail = (directory / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus did not start:\n{tail}")
            time.sleep(0.2)
        yield url
    finally:
        if process is not None:
            stop_process(process, timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


POLL_SECONDS = 1.0
"""How often Prometheus' own /metrics is read while its CPU is measured, in every run
alike (the baseline's too): a group's evaluation is seen within a second of it."""


def measure(label: str, rules: Path | None, fleet: Fleet, port: int, args) -> Run:
    """One run: Prometheus with the rules, left `args.warmup` seconds to fill its rate
    windows, then its CPU measured while every group makes `args.evaluations` evaluations
    (at least the span of that many global ones; without rules, the span), with nothing
    asked of it meanwhile but its own /metrics once a second. The rules API, which renders
    every active alert's labels and texts at each call (a cost of the reading, growing
    with the alerts and with the time between evaluations), is read before the span (the
    groups' intervals) and after it (each rule's own time, over one more evaluation of
    every group)."""
    run = Run(label)
    with prometheus(rules, fleet, port, args) as url:
        since = time.time() + args.warmup
        time.sleep(args.warmup)
        if rules is not None:
            for group in json.loads(_get(f"{url}/api/v1/rules"))["data"]["groups"]:
                run.shares[group["name"]] = min(1.0, args.evaluation_interval / group["interval"])
        cpu_start = (time.time(), read_metrics(url)["process_cpu_seconds_total"][""])
        _watch_groups(url, run, args, since, cpu_start[0])
        metrics = read_metrics(url)
        elapsed = time.time() - cpu_start[0]
        run.cpu_cores = (metrics["process_cpu_seconds_total"][""] - cpu_start[1]) / elapsed
        if rules is not None:
            _time_rules(url, run, args)
        metrics = read_metrics(url)
        run.head_series = metrics["prometheus_tsdb_head_series"][""]
        run.missed = sum(metrics["prometheus_rule_group_iterations_missed_total"].values())
        failed = sum(metrics["prometheus_rule_evaluation_failures_total"].values())
        if failed:
            run.failures.append(f"prometheus_rule_evaluation_failures_total = {failed:g}")
        run.scraped_series = _scalar(query(url, "sum(scrape_samples_scraped)"))
        run.recorded_series = _scalar(query(url, 'count({__name__=~".+:.+"})'))
        run.alert_series = _scalar(query(url, "count(ALERTS)"))
        run.alerts = {
            f"{s['metric']['alertname']} ({s['metric']['alertstate']})": int(float(s["value"][1]))
            for s in query(url, "count by (alertname, alertstate) (ALERTS)")
        }
    run.failures = sorted(set(run.failures))
    return run


def _watch_groups(url: str, run: Run, args, since: float, started: float) -> None:
    """Read /metrics every POLL_SECONDS for the span, and on until every group has made
    its evaluations in it (those that fit at a longer interval of its own, at least one):
    each evaluation's duration and samples written."""
    span = args.evaluations * args.evaluation_interval
    deadline = started + span * 3 + 30
    seen: dict[str, float] = {}

    def wanted(group: str) -> int:
        return max(1, round(args.evaluations * run.shares.get(group, 1.0)))

    while time.time() - started < span or any(
        len(run.durations[g]) < wanted(g) for g in run.shares
    ):
        if time.time() > deadline:
            raise RuntimeError(f"{run.label}: a group evaluated fewer times than the span holds")
        time.sleep(POLL_SECONDS)
        metrics = read_metrics(url)
        stamps = metrics["prometheus_rule_group_last_evaluation_timestamp_seconds"]
        for group, stamp in stamps.items():
            if stamp > since and seen.get(group) != stamp:
                seen[group] = stamp
                run.durations[group].append(
                    metrics["prometheus_rule_group_last_duration_seconds"][group]
                )
                run.samples[group] = metrics["prometheus_rule_group_last_evaluation_samples"][group]


def _time_rules(url: str, run: Run, args) -> None:
    """Each rule's own evaluation time and health from the rules API, read every half
    second until every group has been evaluated once more (after the CPU's span)."""
    longest = max(args.evaluation_interval / share for share in run.shares.values())
    deadline = time.time() + longest * 1.5 + 30
    first: dict[str, str] = {}
    done: set[str] = set()
    while len(done) < len(run.shares) and time.time() < deadline:
        for group in json.loads(_get(f"{url}/api/v1/rules"))["data"]["groups"]:
            name = group["name"]
            stamp = group.get("lastEvaluation", "")
            if name in done or first.setdefault(name, stamp) == stamp:
                continue
            done.add(name)
            for index, rule in enumerate(group["rules"]):
                if rule.get("health") == "err":
                    run.failures.append(f"{rule['name']}: {rule.get('lastError')}")
                run.rules[(name, f"{index:02d} {rule['name']}")].append(rule["evaluationTime"])
        time.sleep(0.5)
    if len(done) < len(run.shares):
        raise RuntimeError(f"{run.label}: a group was not evaluated again in time")


def _scalar(result: list[dict]) -> float:
    return float(result[0]["value"][1]) if result else 0.0


# --- the report ------------------------------------------------------------------------


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


BASELINE = "no-rules"
"""The label of the runs without rules (`--baseline`): what scraping alone costs."""


def report(rule_files: dict[str, Path | None], runs: list[Run], fleet: Fleet, args) -> str:
    labels = list(rule_files)
    by_label = {label: [r for r in runs if r.label == label] for label in labels}
    out = [
        f"{len(fleet.nodes)} nodes x {args.pods} pods ({len(fleet.pods)} pods); scrape every "
        f"{args.scrape_interval:g}s, evaluate every {args.evaluation_interval:g}s, measured "
        f"after {args.warmup:g}s over {args.evaluations * args.evaluation_interval:g}s "
        f"(a group with an interval of its own: the evaluations that fit, at least one) in each "
        f"of {args.rounds} rounds, alternately; medians (ms of wall time per evaluation of "
        f"the group; 'all groups': per global evaluation, each group weighed by its share)",
        "",
    ]
    for label in labels:
        if rule_files[label] is None:
            continue
        selections = raw_selections(rule_files[label].read_text())
        measured = {g for r in by_label[label] for g in r.durations}
        group_names = [g for g in selections if g in measured] + sorted(measured - set(selections))
        out.append(f"{label}: {rule_files[label]}")
        out.append(f"  {'group':<34} {'eval ms':>8} {'spread':>13} {'samples':>8} "
                   f"{'rate()':>6} {'ranges':>6} {'share':>5}")  # fmt: skip
        for group in group_names:
            values = [v * 1e3 for r in by_label[label] for v in r.durations.get(group, [])]
            q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
            rate, ranges = selections.get(group, (0, 0))
            out.append(
                f"  {group:<34} {_median(values):>8.1f} {q[0]:>6.1f}-{q[2]:<6.1f} "
                f"{_median(r.samples.get(group, 0) for r in by_label[label]):>8.0f} "
                f"{rate:>6} {ranges:>6} "
                f"{_median(r.shares.get(group, 1.0) for r in by_label[label]):>5.2f}"
            )
        out.append(f"  {'all groups':<34} {_median(_total(r) for r in by_label[label]):>8.1f} "
                   f"{'':>13} {_median(sum(r.samples.values()) for r in by_label[label]):>8.0f} "
                   f"{sum(s[0] for s in selections.values()):>6} "
                   f"{sum(s[1] for s in selections.values()):>6}")  # fmt: skip
        out.append("  slowest rules (median ms):")
        rule_medians = defaultdict(list)
        for r in by_label[label]:
            for key, values in r.rules.items():
                rule_medians[key].extend(values)
        slowest = sorted(rule_medians.items(), key=lambda kv: -_median(kv[1]))[: args.top]
        for (group, rule), values in slowest:
            out.append(f"    {_median(values) * 1e3:>7.1f}  {group} / {rule[3:]}")
        out.append("")
    out += summary(labels, by_label, args.evaluation_interval)
    out.append("")
    for label in labels:
        rs = by_label[label]
        if rule_files[label] is not None:
            alerts = ", ".join(f"{k}: {v}" for k, v in sorted(rs[-1].alerts.items())) or "none"
            out.append(f"{label} alerts (last round): {alerts}")
        missed = sum(r.missed for r in rs)
        if missed:
            out.append(f"{label}: {missed:g} missed group iterations")
        for failure in sorted({f for r in rs for f in r.failures}):
            out.append(f"{label}: FAILING RULE {failure}")
    return "\n".join(out)


def _total(run: Run) -> float:
    """A run's evaluation time per global evaluation: the sum of its groups' medians (ms),
    each weighed by its evaluations per global one (a group with a longer `interval`
    counts the share of it)."""
    return sum(_median(values) * run.shares.get(group, 1.0)
               for group, values in run.durations.items()) * 1e3  # fmt: skip


def summary(labels: list[str], by_label: dict[str, list[Run]], interval: float) -> list[str]:
    """One row per rule file: the wall time of its groups, the CPU the whole Prometheus
    used, and (with a baseline) the CPU its rules cost per evaluation: the Prometheus' CPU
    over the baseline's in the same round; ratios (x first) taken round by round."""
    rules = [label for label in labels if label != BASELINE]
    baseline = by_label.get(BASELINE)

    def rule_cpu(run: Run, index: int) -> float:
        return (run.cpu_cores - baseline[index].cpu_cores) * interval if baseline else math.nan

    def ratio(label: str, value) -> float:
        pairs = zip(by_label[label], by_label[rules[0]], strict=True)
        return _median(value(r, i) / value(f, i) for i, (r, f) in enumerate(pairs)
                       if value(f, i))  # fmt: skip

    out = [f"{'':<10} {'eval ms':>8} {'x first':>8} {'cores':>6} {'rules s':>8} {'x first':>8} "
           f"{'head':>8} {'scraped':>8} {'recorded':>8} {'ALERTS':>6}"]  # fmt: skip
    for label in labels:
        rs = by_label[label]
        evaluated = label != BASELINE
        out.append(
            f"{label:<10} "
            + (f"{_median(_total(r) for r in rs):>8.1f} "
               f"{ratio(label, lambda r, i: _total(r)):>8.2f} " if evaluated else f"{'':>18}")
            + f"{_median(r.cpu_cores for r in rs):>6.2f} "
            + (f"{_median(rule_cpu(r, i) for i, r in enumerate(rs)):>8.2f} "
               f"{ratio(label, rule_cpu):>8.2f} " if evaluated else f"{'':>18}")
            + f"{_median(r.head_series for r in rs):>8.0f} "
            f"{_median(r.scraped_series for r in rs):>8.0f} "
            f"{_median(r.recorded_series for r in rs):>8.0f} "
            f"{_median(r.alert_series for r in rs):>6.0f}"
        )  # fmt: skip
    for label in labels:
        rs = by_label[label]
        rounds = "cores " + " ".join(f"{r.cpu_cores:.2f}" for r in rs)
        if label != BASELINE:
            rounds = " ".join(f"{_total(r):.0f}" for r in rs) + " ms; " + rounds
            if baseline:
                rounds += "; rules s " + " ".join(f"{rule_cpu(r, i):.2f}" for i, r in enumerate(rs))
        out.append(f"{label} by round: {rounds}")
    out.append(
        "eval ms: the groups' wall times summed per global evaluation; cores: the Prometheus "
        "process's CPU over the measured span; rules s: CPU seconds per global evaluation "
        "beyond the baseline's"
        if baseline else
        "eval ms: the groups' wall times summed per global evaluation; cores: the Prometheus "
        "process's CPU over the measured span (--baseline: the rules' own CPU)"
    )  # fmt: skip
    return out


def parse_rules(values: list[str]) -> dict[str, Path]:
    files = {}
    for value in values:
        label, sep, path = value.rpartition("=")
        label = label if sep else Path(path).stem
        if not Path(path).is_file():
            raise SystemExit(f"no such rule file: {path}")
        files[label] = Path(path)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.rulecost",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--pods", type=int, default=110, help="pods per node")
    parser.add_argument(
        "--rules",
        action="append",
        required=True,
        metavar="[LABEL=]FILE",
        help="a rule file (repeat: run alternately, ratios to the first)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also run without rules each round: the rules' own CPU is the difference",
    )
    parser.add_argument("--scrape-interval", type=float, default=5)
    parser.add_argument("--evaluation-interval", type=float, default=10)
    parser.add_argument(
        "--warmup",
        type=float,
        default=330,
        help="seconds of scrapes before measuring (the rules' 5m rate windows fill: a rate "
        "over a partly filled window reads low, and thresholds in cores with it)",
    )
    parser.add_argument("--evaluations", type=int, default=6, help="per group and round")
    parser.add_argument("--top", type=int, default=8, help="slowest rules listed per file")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args(argv)
    if not shutil.which("prometheus"):
        raise SystemExit("prometheus not found: install Debian's prometheus package")
    rule_files: dict[str, Path | None] = dict(parse_rules(args.rules))
    for label, path in rule_files.items():
        check = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules",
                                str(path)], capture_output=True, text=True)  # fmt: skip
        if check.returncode:
            raise SystemExit(f"{label}: promtool check rules failed:\n{check.stdout}{check.stderr}")
    if args.baseline:
        rule_files[BASELINE] = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    fleet = make_fleet(args.nodes, args.pods, args.seed)
    server = FleetServer(fleet)
    runs = []
    try:
        for round_ in range(args.rounds):
            for label, path in rule_files.items():
                print(f"round {round_ + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
                runs.append(measure(label, path, fleet, server.port, args))
    finally:
        server.close()
    print(report(rule_files, runs, fleet, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

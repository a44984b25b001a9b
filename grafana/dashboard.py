"""Generates grafana/procdelta.json, the procdelta dashboard: `python grafana/dashboard.py`.

Kept as code rather than as hand-edited JSON: the dashboard is a dozen panels of one
shape, and a panel here is one line of intent (title, unit, queries), where in JSON it
is forty lines of layout. Plain dictionaries, no library: Grafana's JSON model is the
interface, and tests/test_deploy.py checks the committed JSON is this script's output
and has a real Prometheus evaluate every query.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
POD = 'uid!="", node=~"$node", namespace=~"$namespace", pod=~"$pod"'
NODE = 'node=~"$node"'
WORKLOAD = 'namespace=~"$namespace", workload=~"$workload"'
NEIGHBOUR = 'uid!=""'
OUTSIDE = 'uid=""'
BY_POD = "sum by (namespace, pod)"


def rate(metric: str, selector: str = POD) -> str:
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


def target(expr: str, legend: str, ref: str) -> dict:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(title: str, unit: str, queries: list[tuple[str, str]], description: str = "") -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)
        ],
    }


def table(title: str, queries: list[tuple[str, str]], description: str, unit: str) -> dict:
    """Each series of the range, reduced to its mean and max over the dashboard's time
    range, one row per series, the largest mean first."""
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "decimals": 2}, "overrides": []},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Mean", "desc": True}]},
        "transformations": [
            {"id": "reduce", "options": {"mode": "seriesToRows", "reducers": ["mean", "max"]}}
        ],
        "targets": [
            target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)
        ],
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def variable(name: str, query: str, label: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def layout(items: list[dict]) -> list[dict]:
    """Two panels a line under full-width rows; ids in order."""
    x = y = 0
    for number, item in enumerate(items, 1):
        item["id"] = number
        if item["type"] == "row":
            if x:
                x, y = 0, y + 8
            item["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        item["gridPos"] = {"h": 8, "w": 12, "x": x, "y": y}
        x, y = (12, y) if x == 0 else (0, y + 8)
    return items


def dashboard() -> dict:
    run_delay = f"{BY_POD} ({rate('procdelta_run_delay_nanos_total')})"
    on_cpu = f"{BY_POD} ({rate('procdelta_on_cpu_nanos_total')})"
    observed = f"{BY_POD} ({rate('procdelta_observed_nanos_total')})"
    cgroup_cpu = f"{BY_POD} ({rate('procdelta_cgroup_cpu_nanos_total')})"
    periods = f"{BY_POD} ({rate('procdelta_cpu_periods_total')})"
    throttled_periods = f"{BY_POD} ({rate('procdelta_cpu_throttled_periods_total')})"
    pods = "{{namespace}}/{{pod}}"
    workloads = "{{workload_type}} {{namespace}}/{{workload}}"
    # The nodes of the selected pods (of the selected workloads): their neighbours' nodes.
    # A pod's process counters or its cgroup's: a pod whose processes never outlive a pass
    # has the latter alone.
    nodes = (
        f"group by (node) (\n  (\n    procdelta_on_cpu_nanos_total{{{POD}}}\n"
        f"    or\n    procdelta_cgroup_cpu_nanos_total{{{POD}}}\n  )\n"
        "  and on (namespace, pod)\n"
        f"  namespace_workload_pod:procdelta_pod_owner:relabel{{{WORKLOAD}}}\n)"
    )
    by_node_pod = "sum by (node, namespace, pod)"
    neighbour_cores = (
        f"(\n  {by_node_pod} ({rate('procdelta_cgroup_cpu_nanos_total', NEIGHBOUR)})\n"
        f"  or on (node, namespace, pod)\n"
        f"  {by_node_pod} ({rate('procdelta_on_cpu_nanos_total', NEIGHBOUR)})\n) / 1e9"
    )
    outside_pods = f"sum by (node) ({rate('procdelta_on_cpu_nanos_total', OUTSIDE)}) / 1e9"
    node_on_cpu = f"sum by (node) ({rate('procdelta_on_cpu_nanos_total', NODE)})"
    node_delay = f"sum by (node) ({rate('procdelta_run_delay_nanos_total', NODE)})"
    panels = [
        row("CPU"),
        panel(
            "CPU starvation",
            "percentunit",
            [(f"{run_delay}\n/\n({run_delay} + {on_cpu})", pods)],
            "Share of runnable time spent waiting for a CPU: run delay / (run delay + on-CPU). "
            "A pod throttled by its own CPU limit waits too: see the throttled share below.",
        ),
        panel("Cores used", "short", [(f"{on_cpu} / 1e9", pods)], "On-CPU seconds per second."),
        panel(
            "Run delay",
            "short",
            [(f"{run_delay} / 1e9", pods)],
            "Seconds spent runnable but waiting for a CPU, per second, summed over threads.",
        ),
        panel(
            "Run delay per observed process-second",
            "percentunit",
            [(f"{run_delay}\n/\n{observed}", pods)],
            "How long a process waits for a CPU per second it is observed.",
        ),
        panel(
            "User and system CPU",
            "short",
            [
                (f"{BY_POD} ({rate('procdelta_cpu_user_nanos_total')}) / 1e9", pods + " user"),
                (f"{BY_POD} ({rate('procdelta_cpu_system_nanos_total')}) / 1e9", pods + " sys"),
            ],
        ),
        panel(
            "Context switches",
            "ops",
            [
                (f"{BY_POD} ({rate('procdelta_voluntary_switches_total')})", pods + " voluntary"),
                (
                    f"{BY_POD} ({rate('procdelta_nonvoluntary_switches_total')})",
                    pods + " involuntary",
                ),
            ],
        ),
        row("Throttled or contended, coverage, pressure (the pod's own cgroup)"),
        panel(
            "Throttled share of CPU periods",
            "percentunit",
            [(f"{throttled_periods}\n/\n({periods} > 0)", pods)],
            "CFS periods in which the pod's own CPU quota throttled it, over periods in "
            "which it had work. High: its run delay is its own limit, not contention. No "
            "series: no quota.",
        ),
        panel(
            "Run delay: throttled or contended",
            "short",
            [
                (f"{run_delay} / 1e9", pods + " run delay"),
                (
                    f"{BY_POD} ({rate('procdelta_cpu_throttled_nanos_total')}) / 1e9",
                    pods + " throttled",
                ),
            ],
            "Seconds per second spent runnable but waiting (summed over threads), beside the "
            "time its quota held its cgroup throttled (per run queue). Close together: the "
            "wait is the limit; run delay far above: contention for the node's CPUs.",
        ),
        panel(
            "Coverage: on-CPU seen by the sums / the cgroup's CPU",
            "percentunit",
            [(f"{on_cpu}\n/\n({cgroup_cpu} > 0)", pods)],
            "The share of the pod's CPU (every task, exited ones included) that its "
            "per-process sums saw. Low: most of its CPU went to processes that lived less "
            "than a pass; their run delay and switches are not in the other panels.",
        ),
        panel(
            "Cores used: sums and cgroup",
            "short",
            [
                (f"{on_cpu} / 1e9", pods + " processes seen"),
                (f"{cgroup_cpu} / 1e9", pods + " cgroup"),
            ],
            "CPU seconds per second: the per-process sums, and the pod's cgroup.",
        ),
        panel(
            "Pressure (PSI some): share of time some task waited",
            "percentunit",
            [
                (
                    f"{BY_POD} ({rate('procdelta_cpu_pressure_waiting_nanos_total')}) / 1e9",
                    pods + " cpu",
                ),
                (
                    f"{BY_POD} ({rate('procdelta_memory_pressure_waiting_nanos_total')}) / 1e9",
                    pods + " memory",
                ),
                (
                    f"{BY_POD} ({rate('procdelta_io_pressure_waiting_nanos_total')}) / 1e9",
                    pods + " io",
                ),
            ],
            "cgroup v2 only: the share of wall time in which at least one of the pod's tasks "
            "waited for a CPU, stalled on memory, or stalled on I/O.",
        ),
        row("Workloads (the workload map of procdelta's rules: kube-state-metrics' owners)"),
        {
            **(
                workload_table := table(
                    "Workloads: pods affected, starvation, throttled share, cores",
                    [
                        (f"namespace_workload:procdelta_pods:count{{{WORKLOAD}}}", "pods"),
                        (
                            f"namespace_workload:procdelta_pods_cpu_starved:count{{{WORKLOAD}}}",
                            "pods starved",
                        ),
                        (
                            f"namespace_workload:procdelta_pods_cpu_throttled:count{{{WORKLOAD}}}",
                            "pods throttled",
                        ),
                        (
                            f"namespace_workload:procdelta_cpu_starvation:ratio_rate5m{{{WORKLOAD}}}",
                            "starvation",
                        ),
                        (
                            "namespace_workload:procdelta_cpu_throttled_periods:ratio_rate5m"
                            f"{{{WORKLOAD}}}",
                            "throttled share",
                        ),
                        (f"namespace_workload:procdelta_cores_used:rate5m{{{WORKLOAD}}}", "cores"),
                    ],
                    "One row per workload (kind, namespace/name), at the end of the time range: "
                    "the pods procdelta saw, how many of them were starved (the "
                    "pod alert's thresholds, their own limits aside) or throttled by their own "
                    "CPU limits, the workload's starvation (its pods' run delay over run delay + "
                    "on-CPU), throttled share of CFS periods, and cores used. A pod without "
                    "owner series is its own workload (kind `pod`).",
                    "short",
                )
            ),
            "targets": [
                {**query, "format": "table", "instant": True} for query in workload_table["targets"]
            ],
            "transformations": [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            "workload_type": "kind",
                            "Value #A": "pods",
                            "Value #B": "pods starved",
                            "Value #C": "pods throttled",
                            "Value #D": "starvation",
                            "Value #E": "throttled share",
                            "Value #F": "cores",
                        },
                    },
                },
            ],
            "options": {
                "showHeader": True,
                "sortBy": [{"displayName": "pods starved", "desc": True}],
            },
        },
        panel(
            "Workload pods starved and throttled (share of its pods)",
            "percentunit",
            [
                (
                    f"namespace_workload:procdelta_pods_cpu_starved:ratio{{{WORKLOAD}}}",
                    workloads + " starved",
                ),
                (
                    f"namespace_workload:procdelta_pods_cpu_throttled:ratio{{{WORKLOAD}}}",
                    workloads + " throttled",
                ),
            ],
            "The share of the workload's pods (seen by procdelta) that are starved, or "
            "throttled by their own CPU limits: what the workload alerts fire on.",
        ),
        panel(
            "Workload CPU starvation",
            "percentunit",
            [
                (
                    f"namespace_workload:procdelta_cpu_starvation:ratio_rate5m{{{WORKLOAD}}}",
                    workloads,
                )
            ],
            "Run delay over run delay + on-CPU, summed over the workload's pods (5m).",
        ),
        panel(
            "Workload cores used: sums and cgroups",
            "short",
            [
                (f"namespace_workload:procdelta_cores_used:rate5m{{{WORKLOAD}}}", workloads),
                (
                    f"namespace_workload:procdelta_cgroup_cores_used:rate5m{{{WORKLOAD}}}",
                    workloads + " cgroup",
                ),
            ],
            "On-CPU of the workload's processes, and its pods' cgroups' CPU (5m).",
        ),
        row("Neighbours: what ran on the selected pods' nodes"),
        {
            **table(
                "Neighbours: cores used per pod on the selected pods' nodes",
                [
                    (f"{neighbour_cores}\nand on (node)\n{nodes}", "{{node}} " + pods),
                    (
                        f"{outside_pods}\nand on (node)\n{nodes}",
                        "{{node}} processes outside pods",
                    ),
                ],
                "Every pod on the nodes where the selected pods (of the selected workloads) "
                "ran, ranked by the CPU it used over the time range: its cgroup's (short-lived "
                "processes included) where procdelta reads cgroups, else its processes' "
                "on-CPU. A starved pod's contenders are at the top.",
                "short",
            ),
        },
        panel(
            "Node saturation: runnable threads per CPU",
            "percentunit",
            [
                (
                    f"({node_on_cpu} + {node_delay}) / 1e9\n/ on (node)\n"
                    "max by (node) (procdelta_node_cpus)\n"
                    f"and on (node)\n{nodes}",
                    "{{node}} runnable threads per CPU",
                ),
                (
                    f"{node_delay}\n/\n({node_delay} + {node_on_cpu})\nand on (node)\n{nodes}",
                    "{{node}} starvation",
                ),
            ],
            "On-CPU plus run delay per second of everything procdelta sees on the node, over "
            "its CPUs (kube-state-metrics' capacity): above 100%, more threads want a CPU than "
            "it has. Beside it, the share of the node's runnable time spent waiting.",
        ),
        row("Memory and storage"),
        panel(
            "Storage I/O",
            "Bps",
            [
                (f"{BY_POD} ({rate('procdelta_read_bytes_total')})", pods + " read"),
                (f"{BY_POD} ({rate('procdelta_write_bytes_total')})", pods + " write"),
            ],
            "Bytes really fetched from and sent to storage (not page-cache hits).",
        ),
        panel(
            "Major page faults",
            "ops",
            [(f"{BY_POD} ({rate('procdelta_major_faults_total')})", pods)],
        ),
        panel(
            "Processes and threads",
            "short",
            [
                (f"{BY_POD} (procdelta_footprint_processes{{{POD}}})", pods + " processes"),
                (f"{BY_POD} (procdelta_footprint_threads{{{POD}}})", pods + " threads"),
            ],
        ),
        panel(
            "Resident memory",
            "bytes",
            [(f"{BY_POD} (procdelta_footprint_rss_bytes{{{POD}}})", pods)],
        ),
        row("procdelta itself"),
        panel(
            "Pass duration",
            "s",
            [
                (
                    "histogram_quantile(0.5, sum by (node, le) "
                    f"({rate('procdelta_pass_duration_seconds_bucket', NODE)}))",
                    "{{node}} p50",
                ),
                (
                    "histogram_quantile(0.99, sum by (node, le) "
                    f"({rate('procdelta_pass_duration_seconds_bucket', NODE)}))",
                    "{{node}} p99",
                ),
            ],
        ),
        panel(
            "Dropped deltas",
            "ops",
            [
                (
                    f"sum by (reason) ({rate('procdelta_dropped_deltas_total', NODE)})",
                    "{{reason}}",
                ),
                (
                    f"sum by (reason) ({rate('procdelta_dropped_thread_deltas_total', NODE)})",
                    "thread {{reason}}",
                ),
                (
                    f"sum by (reason) ({rate('procdelta_dropped_cgroup_deltas_total', NODE)})",
                    "cgroup {{reason}}",
                ),
            ],
            "Processes that contributed no delta to a pass, threads left out of a "
            "contributing process's sums, and groups whose cgroup gave no delta, by reason, "
            "per second.",
        ),
        panel(
            "Sources the nodes provide",
            "short",
            [(f"min by (source) (procdelta_source_available{{{NODE}}})", "{{source}}")],
            "1 on every node, or 0 where a node lacks it: schedstat, per-thread io, each "
            "cgroup hierarchy, PSI. procdelta's log says at start-up which fields a missing "
            "one leaves empty.",
        ),
        panel(
            "Tracked processes and threads",
            "short",
            [
                (f"sum by (node) (procdelta_tracked_processes{{{NODE}}})", "{{node}} processes"),
                (f"sum by (node) (procdelta_tracked_threads{{{NODE}}})", "{{node}} threads"),
            ],
        ),
        panel(
            "Passes",
            "ops",
            [(f"sum by (node) ({rate('procdelta_passes_total', NODE)})", "{{node}}")],
        ),
    ]
    return {
        "uid": "procdelta",
        "title": "procdelta: per-pod process counters",
        "description": "CPU starvation (throttled or contended), coverage, pressure, CPU, I/O "
        "and switches per pod, from procdelta.",
        "tags": ["procdelta", "kubernetes"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                variable("node", "label_values(procdelta_build_info, node)", "Node"),
                variable(
                    "namespace",
                    'label_values(procdelta_footprint_processes{node=~"$node"}, namespace)',
                    "Namespace",
                ),
                variable(
                    "workload",
                    "label_values(namespace_workload:procdelta_pods:count"
                    '{namespace=~"$namespace"}, workload)',
                    "Workload",
                ),
                variable(
                    "pod",
                    'label_values(procdelta_footprint_processes{node=~"$node", '
                    'namespace=~"$namespace"}, pod)',
                    "Pod",
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": layout(panels),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("procdelta.json")
    out.write_text(render())
    sys.stdout.write(f"wrote {out}\n")

"""Generates grafana/procdelta.json, the procdelta dashboard: `python grafana/dashboard.py`.

Kept as code rather than as hand-edited JSON: the dashboard is a few dozen panels of one
shape, and a panel here is one line of intent (title, unit, queries), where in JSON it
is forty lines of layout. Plain dictionaries, no library: Grafana's JSON model is the
interface. `--check` writes nothing and exits 1 if the committed JSON is not this
script's output; tests/integration/test_deploy.py fails on the same comparison,
tests/integration/test_dashboard.py checks the queries' shape, and
tests/kernel/test_end_to_end.py has a real Prometheus evaluate every query over the project's
rules.

The variables are a chain, as kubernetes-mixin's: cluster -> namespace -> workload -> pod,
each one's values filtered by those before it. Every "All" is the regex `.*`, which also
matches a label that is absent (`cluster` on a single-cluster Prometheus). The top rows
read the few per-pod recording rules (cores, why it waited, throttled share); every other
per-pod panel takes its `rate()`s at query time over the counters of the selected
namespace's pods only (the selector carries `$namespace` and `$pod`), and keeps the pods of
the selected workloads through the rules' pod -> workload map; the panels per node show the
nodes of those pods.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
CLUSTER = 'cluster=~"$cluster"'
POD = f'{CLUSTER}, namespace=~"$namespace", pod=~"$pod", pod!=""'
WORKLOAD = f'{CLUSTER}, namespace=~"$namespace", workload=~"$workload"'
OWNER = "namespace_workload_pod:procdelta_pod_owner:relabel"
OWNERS = f'{OWNER}{{{WORKLOAD}, pod!=""}}'
"""The pods of the selected workloads, from the rules' pod -> workload map."""
IN_WORKLOADS = f"and on (cluster, namespace, pod)\n{OWNERS}"
"""Keeps a per-pod series whose pod is one of the selected workloads'."""
PODS = "{{cluster}} {{namespace}}/{{pod}}"
"""A pod in a legend, its cluster first (empty where the label is absent)."""
WORKLOADS = "{{cluster}} {{workload_type}} {{namespace}}/{{workload}}"


def cause(name: str) -> str:
    """One cause's share of the time each selected pod had work (the recorded causes)."""
    ratio = f'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{{cause="{name}", {POD}}}'
    return f"sum without (cause) (\n{ratio}\n)\n{IN_WORKLOADS}"


def pod_rate(field: str) -> str:
    """A counter's rate per selected pod, taken at query time over their series alone."""
    return (
        f"sum by (cluster, node, namespace, pod) "
        f"(rate(procdelta_{field}_total{{{POD}}}[$__rate_interval]))"
    )


def raw(field: str, scale: str = "") -> str:
    """`pod_rate` for the selected pods of the selected workloads, divided if given."""
    divided = f" / {scale}" if scale else ""
    return f"{pod_rate(field)}{divided}\n{IN_WORKLOADS}"


def raw_ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator per selected pod, no series where the second is 0."""
    return f"{pod_rate(numerator)}\n/\n({denominator} > 0)\n{IN_WORKLOADS}"


def per_pod(record: str, scale: str = "") -> str:
    """A per-pod recording rule (`node_namespace_pod:procdelta_<record>`) for the selected
    pods of the selected workloads, divided by a constant if given."""
    divided = f" / {scale}" if scale else ""
    return f"node_namespace_pod:procdelta_{record}{{{POD}}}{divided}\n{IN_WORKLOADS}"


def waited(stall: str, delay: str) -> str:
    """A cause's seconds of waiting per second, per pod, on the basis the pod has it: its
    `stall` field (wall time, from cgroup CPU pressure), else its `delay` field (its run
    delay's part, thread-time)."""
    either = f"{pod_rate(stall + '_nanos')}\nor\n{pod_rate(delay + '_nanos')}"
    return f"(\n{either}\n) / 1e9\n{IN_WORKLOADS}"


def per_workload(record: str, scale: str = "") -> str:
    divided = f" / {scale}" if scale else ""
    return f"namespace_workload:procdelta_{record}{{{WORKLOAD}}}{divided}"


WORKLOAD_PODS = f"count by (cluster, namespace, workload, workload_type) (\n{OWNERS}\n)"
"""The pods procdelta saw of each selected workload."""


def workload_rate(field: str) -> str:
    """A counter's rate summed over each selected workload's pods, at query time."""
    per_pod_rate = (
        f"sum by (cluster, namespace, pod) "
        f'(rate(procdelta_{field}_total{{{CLUSTER}, namespace=~"$namespace", pod!=""}}'
        f"[$__rate_interval]))"
    )
    return (
        f"sum by (cluster, namespace, workload, workload_type) (\n{per_pod_rate}\n"
        f"* on (cluster, namespace, pod) group_left (workload, workload_type)\n{OWNERS}\n)"
    )


# The nodes of the selected pods (of the selected workloads): where their neighbours ran.
NODES = (
    "group by (cluster, node) (\n"
    f"  node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m{{{POD}}}\n"
    f"  and on (cluster, namespace, pod)\n  {OWNERS}\n)"
)
ON_NODES = f"and on (cluster, node)\n{NODES}"
"""Keeps a per-node series whose node ran one of the selected pods."""


NODE = f'{CLUSTER}, node=~"$node"'
"""The selected nodes."""


def node_rate(field: str) -> str:
    """A counter's rate per selected node, over every group procdelta sees there."""
    return f"sum by (cluster, node) (rate(procdelta_{field}_total{{{NODE}}}[$__rate_interval]))"


RUNNABLE = f"({node_rate('on_cpu_nanos')}\n+ {node_rate('run_delay_nanos')})"
"""On-CPU plus run delay per second: the threads on a CPU or waiting for one, per node."""


def rate(metric: str) -> str:
    """A rate of one of procdelta's own per-node counters (not per pod), of the selected
    nodes only."""
    return f"rate({metric}{{{NODE}}}[$__rate_interval])"


def target(expr: str, legend: str, ref: str) -> dict:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    title: str,
    unit: str,
    queries: list[tuple[str, str]],
    description: str = "",
    width: int = 12,
) -> dict:
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
        "gridPos": {"h": 8, "w": width},
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
        "gridPos": {"h": 8, "w": 12},
    }


def instant_table(
    title: str,
    columns: list[tuple[str, str, str]],
    description: str,
    sort_by: str,
    width: int = 12,
) -> dict:
    """One row per series' labels, one column per query (its name, its unit), at the end
    of the time range: the queries' series merged on their labels."""
    base = table(title, [(expr, name) for expr, name, _ in columns], description, "short")
    units = [
        {
            "matcher": {"id": "byName", "options": name},
            "properties": [{"id": "unit", "value": unit}]
            + ([{"id": "decimals", "value": 0}] if unit == "none" else []),
        }
        for _, name, unit in columns
    ]
    return {
        **base,
        "fieldConfig": {"defaults": {"decimals": 2}, "overrides": units},
        "targets": [{**query, "format": "table", "instant": True} for query in base["targets"]],
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": {
                        "workload_type": "kind",
                        **{
                            f"Value #{chr(ord('A') + i)}": name
                            for i, (_, name, _) in enumerate(columns)
                        },
                    },
                },
            },
        ],
        "options": {"showHeader": True, "sortBy": [{"displayName": sort_by, "desc": True}]},
        "gridPos": {"h": 8, "w": width},
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def variable(name: str, query: str, label: str, first: bool = False) -> dict:
    """A query variable; "All" by default, or (`first`) its first value: a big cluster's
    panels then ask for one namespace's pods, or one node's, until the user widens them.
    Such a variable has no "All" option: Grafana 11's scenes take a variable with one and
    no value set for All (`defaultToAll` follows `includeAll`), whatever `current` says."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": not first,
        "multi": True,
        **({} if first else {"allValue": ".*"}),
        "current": {} if first else {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def layout(items: list[dict]) -> list[dict]:
    """Panels left to right in lines 24 units wide, each its own width; full-width rows;
    ids in order."""
    x = y = 0
    for number, item in enumerate(items, 1):
        item["id"] = number
        if item["type"] == "row":
            if x:
                x, y = 0, y + 8
            item["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        width = item["gridPos"]["w"]
        if x + width > 24:
            x, y = 0, y + 8
        item["gridPos"] = {"h": 8, "w": width, "x": x, "y": y}
        x += width
        if x == 24:
            x, y = 0, y + 8
    return items


FINDINGS = "See docs/findings.md for what it means, how far to trust it, and what to do."
CAUSES = (
    "over the time the pod had work, on the basis procdelta took its wait on: where its "
    "cgroup has CPU pressure, the kernel's moment-by-moment account (wall time, over its "
    "`full` stall plus its CPU, at most the wall time); elsewhere its run delay split over "
    "the interval (thread-time, over run delay + on-CPU of the passes split so)"
)


STARVATION = raw_ratio(
    "run_delay_nanos", f"{pod_rate('run_delay_nanos')} + {pod_rate('on_cpu_nanos')}"
)
"""Run delay / (run delay + on-CPU) per selected pod, whatever the cause."""
WORKLOAD_STARVATION = (
    f"{workload_rate('run_delay_nanos')}\n/\n"
    f"({workload_rate('run_delay_nanos')}\n+ {workload_rate('on_cpu_nanos')} > 0)"
)
WORKLOAD_THROTTLED = (
    f"{workload_rate('cpu_throttled_periods')}\n/\n({workload_rate('cpu_periods')} > 0)"
)


def pods_of(finding: str) -> str:
    """How many of each selected workload's pods a pod finding covers (its recorded share
    times its pods)."""
    share = f"namespace_workload:procdelta_pods_cpu_{finding}:ratio{{{WORKLOAD}}}"
    return (
        f"round(\n{share}\n* on (cluster, namespace, workload, workload_type)\n{WORKLOAD_PODS}\n)"
    )


def cpu_panels() -> list[dict]:
    return [
        row("CPU: starvation and its three causes (per pod)"),
        panel(
            "CPU starvation",
            "percentunit",
            [(STARVATION, PODS)],
            "The share of the pod's "
            "runnable time its threads spent waiting for a CPU, run delay / (run delay + "
            "on-CPU), whatever the cause (thread-time, its long-lived processes). The three "
            "panels below say why, each a share of the time the pod had work. No series: an "
            f"idle pod. {FINDINGS}",
        ),
        instant_table(
            "CPU wait by cause, per pod",
            [
                (STARVATION, "starvation", "percentunit"),
                (cause("throttled"), "own CPU limit", "percentunit"),
                (cause("own_threads"), "own threads", "percentunit"),
                (cause("neighbours"), "neighbours", "percentunit"),
                (per_pod("cpu_throttled_periods:ratio_rate5m"), "throttled share", "percentunit"),
                (per_pod("cgroup_cpu_nanos:rate5m", "1e9"), "cores", "short"),
            ],
            "One row per pod, at the end of the time range: its starvation, the shares of "
            "the time it had work its own CPU limit, its own threads and its neighbours "
            "explain (the three panels below), the share of CFS periods its quota throttled, "
            f"and the cores it used. {FINDINGS}",
            "starvation",
        ),
        panel(
            "CPU wait: own CPU limit",
            "percentunit",
            [(cause("throttled"), PODS)],
            'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="throttled"}: the part '
            "of the "
            "pod's wait that its own CPU quotas explain, "
            f"{CAUSES} (cpu_stalled_throttled_nanos, run_delay_throttled_nanos). The pod "
            "waits for its own limit, not for the node: ProcdeltaPodCPUThrottled fires on "
            f"this part (or on the throttled share of periods). {FINDINGS}",
            width=8,
        ),
        panel(
            "CPU wait: own threads",
            "percentunit",
            [(cause("own_threads"), PODS)],
            'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="own_threads"}: the part '
            "of the "
            "pod's wait spent queued behind its own threads (its tasks waited on a CPU where "
            f"another of its own ran), {CAUSES} (cpu_waiting_own_threads_nanos, "
            "run_delay_own_threads_nanos): more runnable threads than the CPUs it may use, "
            f"neighbours or not: ProcdeltaPodCPUOwnThreads fires on this part. {FINDINGS}",
            width=8,
        ),
        panel(
            "CPU wait: neighbours",
            "percentunit",
            [(cause("neighbours"), PODS)],
            'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="neighbours"}: the part '
            "of the "
            "pod's wait explained by other groups holding the CPUs it could use (its tasks "
            f"waited behind theirs), {CAUSES} (cpu_stalled_neighbours_nanos, "
            "run_delay_neighbours_nanos). ProcdeltaPodCPUStarved fires on this part, and "
            "ProcdeltaNodeCPUSaturated on the pods it finds on a node; the neighbours row "
            f"below ranks who ran on the pod's node. {FINDINGS}",
            width=8,
        ),
        panel(
            "Waiting by cause",
            "short",
            [
                (waited(stall, delay), f"{PODS} {cause}")
                for cause, stall, delay in (
                    ("own CPU limit", "cpu_stalled_throttled", "run_delay_throttled"),
                    ("own threads", "cpu_waiting_own_threads", "run_delay_own_threads"),
                    ("neighbours", "cpu_stalled_neighbours", "run_delay_neighbours"),
                )
            ],
            "Seconds per second the pod waited, by cause, on the basis procdelta took its wait "
            "on. Where its cgroup has CPU pressure: wall time, each moment some task of it "
            "waited given to one cause (procdelta_cpu_stalled_throttled_nanos_total, "
            "procdelta_cpu_waiting_own_threads_nanos_total, "
            "procdelta_cpu_stalled_neighbours_nanos_total, their rates / 1e9). Elsewhere: "
            "thread-time, the parts of its run delay each cause explains over the interval "
            f"(procdelta_run_delay_throttled_nanos_total and so on). {FINDINGS}",
        ),
        panel(
            "Throttled share of CPU periods",
            "percentunit",
            [(per_pod("cpu_throttled_periods:ratio_rate5m"), PODS)],
            "node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m: CFS periods in "
            "which the pod's own CPU quota throttled it, over periods in which it had work "
            "(summed over the pod's cgroup and every cgroup below it, so one container at its "
            "limit beside a sidecar that runs briefly in many periods reads low: its wait "
            f"still shows in the own-limit part above). No series: no quota. {FINDINGS}",
        ),
        row("CPU use (per pod)"),
        panel(
            "Cores used",
            "short",
            [(raw("on_cpu_nanos", "1e9"), PODS)],
            "On-CPU seconds per second of the pod's processes "
            "(rate(procdelta_on_cpu_nanos_total) / 1e9).",
        ),
        panel(
            "Run delay",
            "short",
            [(raw("run_delay_nanos", "1e9"), PODS)],
            "Seconds spent runnable but waiting for a CPU, per second, summed over threads "
            "(rate(procdelta_run_delay_nanos_total) / 1e9).",
        ),
        panel(
            "Context switches",
            "ops",
            [
                (raw("voluntary_switches"), PODS + " voluntary"),
                (raw("nonvoluntary_switches"), PODS + " involuntary"),
            ],
            "Per second, summed over threads: voluntary (the thread blocked) and involuntary "
            "(the scheduler took its CPU).",
        ),
        panel(
            "Cores used: sums and cgroup",
            "short",
            [
                (raw("on_cpu_nanos", "1e9"), PODS + " processes seen"),
                (per_pod("cgroup_cpu_nanos:rate5m", "1e9"), PODS + " cgroup"),
            ],
            "CPU seconds per second: the per-process sums, and the pod's cgroup (every task, "
            "exited ones included).",
        ),
        panel(
            "Coverage: on-CPU seen by the sums / the cgroup's CPU",
            "percentunit",
            [(raw_ratio("on_cpu_nanos", pod_rate("cgroup_cpu_nanos")), PODS)],
            "Coverage: the share of the pod's "
            "CPU (every task, exited ones included) that its per-process sums saw. Low: most "
            "of its CPU went to processes that lived less than a pass; their run delay and "
            "switches are not in the other panels.",
        ),
        panel(
            "Pressure (PSI some): share of time some task waited",
            "percentunit",
            [
                (raw("cpu_pressure_waiting_nanos", "1e9"), PODS + " cpu"),
                (raw("memory_pressure_waiting_nanos", "1e9"), PODS + " memory"),
                (raw("io_pressure_waiting_nanos", "1e9"), PODS + " io"),
            ],
            "cgroup v2 only: the share of wall time in which at least one of the pod's tasks "
            "waited for a CPU, stalled on memory, or stalled on I/O.",
        ),
    ]


def workload_panels() -> list[dict]:
    return [
        row("Workloads (the workload map of procdelta's rules: kube-state-metrics' owners)"),
        instant_table(
            "Workloads: pods affected, starvation, throttled share, cores",
            [
                (WORKLOAD_PODS, "pods", "none"),
                (pods_of("starved"), "pods starved", "none"),
                (pods_of("throttled"), "pods throttled", "none"),
                (WORKLOAD_STARVATION, "starvation", "percentunit"),
                (WORKLOAD_THROTTLED, "throttled share", "percentunit"),
                (f"{workload_rate('cgroup_cpu_nanos')} / 1e9", "cores", "short"),
            ],
            "One row per workload (kind, namespace/name), at the end of the time range: the "
            "pods procdelta saw, how many of them are starved (ProcdeltaPodCPUStarved's "
            "condition: waiting for their neighbours) or throttled by their own CPU limits "
            "(ProcdeltaPodCPUThrottled's), the workload's starvation (its pods' run delay "
            "over run delay + on-CPU), throttled share of CFS periods, and cores used. A pod "
            f"without owner series is its own workload (kind `pod`). {FINDINGS}",
            "pods starved",
        ),
        panel(
            "Workload pods starved and throttled (share of its pods)",
            "percentunit",
            [
                (per_workload("pods_cpu_starved:ratio"), WORKLOADS + " starved"),
                (per_workload("pods_cpu_throttled:ratio"), WORKLOADS + " throttled"),
            ],
            "The share of the workload's pods (seen by procdelta) that are starved by their "
            "neighbours, or throttled by their own CPU limits: what the workload alerts "
            f"fire on. {FINDINGS}",
        ),
        panel(
            "Workload CPU starvation",
            "percentunit",
            [(WORKLOAD_STARVATION, WORKLOADS)],
            "Run delay over run "
            "delay + on-CPU, summed over the workload's pods (5m), whatever the cause.",
            width=8,
        ),
        panel(
            "Workload cores used: sums and cgroups",
            "short",
            [
                (f"{workload_rate('on_cpu_nanos')} / 1e9", WORKLOADS),
                (f"{workload_rate('cgroup_cpu_nanos')} / 1e9", WORKLOADS + " cgroup"),
            ],
            "On-CPU of the workload's processes, and its pods' cgroups' CPU (5m).",
            width=8,
        ),
    ]


def neighbour_panels() -> list[dict]:
    neighbours = f'node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m{{{NODE}, pod!=""}} / 1e9'
    outside = f"node:procdelta_outside_pods_on_cpu_nanos:rate5m{{{NODE}}} / 1e9"
    return [
        row("Neighbours: what ran on the selected nodes, where the selected pods ran"),
        table(
            "Neighbours: cores used per pod on the selected nodes",
            [
                (f"{neighbours}\n{ON_NODES}", "{{cluster}} {{node}} " + PODS),
                (f"{outside}\n{ON_NODES}", "{{cluster}} {{node}} processes outside pods"),
            ],
            "Every pod on the selected nodes ($node) where the selected pods (of the selected "
            "workloads) ran, "
            "ranked by the cores its cgroup used over the time range "
            "(node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m / 1e9: every task, "
            "short-lived ones included), beside the processes outside pods "
            "(node:procdelta_outside_pods_on_cpu_nanos:rate5m / 1e9): the series "
            "ProcdeltaPodCPUStarved's text ranks (its three busiest, the pod itself left "
            "out). A starved pod's contenders are at the top.",
            "short",
        ),
        panel(
            "Node saturation: starved pods, runnable threads per CPU",
            "short",
            [
                (
                    f"node:procdelta_pods_cpu_starved:count{{{NODE}}}\n{ON_NODES}",
                    "{{cluster}} {{node}} starved pods",
                ),
                (
                    f"{RUNNABLE} / 1e9\n/ on (cluster, node)\n"
                    f"(max by (cluster, node) (procdelta_node_cpus{{{NODE}}}) > 0)\n{ON_NODES}",
                    "{{cluster}} {{node}} runnable threads per CPU",
                ),
                (
                    f"{node_rate('run_delay_nanos')}\n/\n({RUNNABLE} > 0)\n{ON_NODES}",
                    "{{cluster}} {{node}} starvation",
                ),
            ],
            "For the selected nodes ($node) where the selected pods ran: the pods starved "
            "there within their entitlement, on the kernel's basis "
            "(node:procdelta_pods_cpu_starved:count), what ProcdeltaNodeCPUSaturated pages "
            "on; the runnable threads per "
            "CPU (on-CPU plus run delay per second of every group procdelta sees on the node, "
            "over procdelta_node_cpus: above 1, more threads want a CPU than the node has, "
            "its pods' own quotas' throttled threads included); and the share of the node's "
            f"runnable time spent waiting. {FINDINGS}",
        ),
    ]


def node_panels() -> list[dict]:
    """The selected node alone, whatever pods are selected: what a node's page
    (ProcdeltaNodeCPUSaturated, its `dashboard_url`) opens on."""
    finding = "node_namespace_pod:procdelta_cpu_finding:ratio_rate5m"
    starved = f'{finding}{{{NODE}, finding="starved", pod!=""}}'
    paged = f'node_namespace_pod:procdelta_cpu_starved_paged:ratio_rate5m{{{NODE}, pod!=""}}'
    beside = f'node_namespace_pod:procdelta_cgroup_cpu_nanos:rate5m{{{NODE}, pod!=""}} / 1e9'
    outside = f"node:procdelta_outside_pods_on_cpu_nanos:rate5m{{{NODE}}} / 1e9"
    return [
        row("The selected node: its starved pods, and the pods beside them"),
        table(
            "Node: its starved pods",
            [
                (starved, "{{cluster}} {{node}} {{namespace}}/{{pod}} starved ({{basis}})"),
                (paged, "{{cluster}} {{node}} {{namespace}}/{{pod}} owed (its page's)"),
            ],
            "The pods of the selected nodes ($node) starved over the time range: the "
            "neighbours' share of the time they had work (ProcdeltaPodCPUStarved's "
            "condition, on the kernel's basis or the interval's), and of those the ones "
            "the node's page is for, within their entitlement on the kernel's basis "
            f"(node_namespace_pod:procdelta_cpu_starved_paged:ratio_rate5m). {FINDINGS}",
            "percentunit",
        ),
        table(
            "Node: cores used per pod beside them",
            [
                (beside, "{{cluster}} {{node}} {{namespace}}/{{pod}}"),
                (outside, "{{cluster}} {{node}} processes outside pods"),
            ],
            "Every pod of the selected nodes ($node), ranked by the cores its cgroup used "
            "over the time range (every task, short-lived ones included), and the processes "
            "outside pods there: who held the CPUs the starved pods waited for.",
            "short",
        ),
    ]


def memory_panels() -> list[dict]:
    def footprint(metric: str) -> str:
        return f"sum by (cluster, namespace, pod) ({metric}{{{POD}}})\n{IN_WORKLOADS}"

    return [
        row("Memory and storage (per pod)"),
        panel(
            "Storage I/O",
            "Bps",
            [
                (raw("read_bytes"), PODS + " read"),
                (raw("write_bytes"), PODS + " write"),
            ],
            "Bytes really fetched from and sent to storage (not page-cache hits).",
            width=8,
        ),
        panel(
            "Processes and threads",
            "short",
            [
                (footprint("procdelta_footprint_processes"), PODS + " processes"),
                (footprint("procdelta_footprint_threads"), PODS + " threads"),
            ],
            "What the last pass saw of the pod.",
            width=8,
        ),
        panel(
            "Resident memory",
            "bytes",
            [(footprint("procdelta_footprint_rss_bytes"), PODS)],
            "The resident memory of the pod's processes at the last pass.",
            width=8,
        ),
    ]


def self_panels() -> list[dict]:
    def quantile(q: str) -> str:
        buckets = rate("procdelta_pass_duration_seconds_bucket")
        return f"histogram_quantile({q}, sum by (cluster, node, le) ({buckets}))\n{ON_NODES}"

    def by_reason(metric: str) -> str:
        return f"sum by (reason) (\n{rate(metric)}\n{ON_NODES}\n)"

    return [
        row("procdelta itself (on the selected nodes, where the selected pods ran)"),
        panel(
            "Pass duration",
            "s",
            [
                (quantile("0.5"), "{{cluster}} {{node}} p50"),
                (quantile("0.99"), "{{cluster}} {{node}} p99"),
            ],
        ),
        panel(
            "Dropped deltas",
            "ops",
            [
                (by_reason("procdelta_dropped_deltas_total"), "{{reason}}"),
                (by_reason("procdelta_dropped_thread_deltas_total"), "thread {{reason}}"),
                (by_reason("procdelta_dropped_cgroup_deltas_total"), "cgroup {{reason}}"),
            ],
            "Processes that contributed no delta to a pass, threads left out of a "
            "contributing process's sums, and groups whose cgroup gave no delta, by reason, "
            "per second.",
        ),
        panel(
            "Sources the nodes provide",
            "short",
            [
                (
                    f"min by (source) (\nprocdelta_source_available{{{NODE}}}\n{ON_NODES}\n)",
                    "{{source}}",
                )
            ],
            "1 on every node, or 0 where a node lacks it: schedstat, per-thread io, each "
            "cgroup hierarchy, PSI. procdelta's log says at start-up which fields a missing "
            "one leaves empty.",
        ),
        panel(
            "Tracked processes and threads",
            "short",
            [
                (
                    f"sum by (cluster, node) (procdelta_tracked_processes{{{NODE}}})\n{ON_NODES}",
                    "{{cluster}} {{node}} processes",
                ),
                (
                    f"sum by (cluster, node) (procdelta_tracked_threads{{{NODE}}})\n{ON_NODES}",
                    "{{cluster}} {{node}} threads",
                ),
            ],
        ),
        panel(
            "Passes",
            "ops",
            [
                (
                    f"sum by (cluster, node) ({rate('procdelta_passes_total')})\n{ON_NODES}",
                    "{{cluster}} {{node}}",
                )
            ],
        ),
    ]


def variables() -> list[dict]:
    """The chain cluster -> namespace -> workload -> pod, each filtered by those before it;
    the last three from the rules' pod -> workload map, which holds every pod procdelta saw
    (and named) over the rules' window, with or without kube-state-metrics."""
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        variable("cluster", "label_values(procdelta_build_info, cluster)", "Cluster"),
        variable(
            "node", f"label_values(procdelta_build_info{{{CLUSTER}}}, node)", "Node", first=True
        ),
        variable(
            "namespace",
            f'label_values({OWNER}{{{CLUSTER}, pod!=""}}, namespace)',
            "Namespace",
            first=True,
        ),
        variable(
            "workload",
            f'label_values({OWNER}{{{CLUSTER}, namespace=~"$namespace", pod!=""}}, workload)',
            "Workload",
        ),
        variable("pod", f"label_values({OWNERS}, pod)", "Pod"),
    ]


def dashboard() -> dict:
    panels = [
        *cpu_panels(),
        *workload_panels(),
        *neighbour_panels(),
        *node_panels(),
        *memory_panels(),
        *self_panels(),
    ]
    return {
        "uid": "procdelta",
        "title": "procdelta: per-pod process counters",
        "description": "CPU starvation per pod and its three causes (its own CPU limit, its "
        "own threads, its neighbours), coverage, pressure, CPU, I/O and switches per pod and "
        "per workload, from procdelta's counters and its recording rules.",
        "tags": ["procdelta", "kubernetes"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "templating": {"list": variables()},
        "annotations": {"list": []},
        "panels": layout(panels),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


CLUSTER_LABEL = re.compile(r'(?<![$\w"])cluster(?==~|,|\))|(?<=\{\{)cluster(?=\}\})')
"""Where the dashboard names the cluster label (never the `$cluster` variable): a chart's
copy puts its `clusterLabel` there."""


def with_cluster_label(text: str, label: str) -> str:
    """The dashboard's JSON with the cluster label named `label`."""
    return CLUSTER_LABEL.sub(label, text)


USAGE = """usage: python grafana/dashboard.py [--check]

Writes grafana/procdelta.json, procdelta's Grafana dashboard, from this script.
  --check   write nothing; exit 1 if the committed JSON is not this script's output
  --help    this text
"""


def main(argv: list[str]) -> int:
    out = Path(__file__).with_name("procdelta.json")
    unknown = [arg for arg in argv if arg not in ("--check", "--help", "-h")]
    if unknown or "--help" in argv or "-h" in argv:
        (sys.stderr if unknown else sys.stdout).write(USAGE)
        return 2 if unknown else 0
    if "--check" in argv:
        if not out.exists() or out.read_text() != render():
            sys.stderr.write(f"stale: {out} (run python grafana/dashboard.py)\n")
            return 1
        return 0
    out.write_text(render())
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

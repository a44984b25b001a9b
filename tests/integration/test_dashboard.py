"""The dashboard (grafana/procdelta.json): its queries read as text, and evaluated by promtool
over the project's rules on a small made-up fleet.

tests/integration/test_deploy.py checks the JSON is grafana/dashboard.py's output and the neighbours
panel's ranking; tests/kernel/test_end_to_end.py has a real Prometheus evaluate every query over
what a real collector scraped.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.test_deploy import RULES, VARIABLES, dashboard_queries, set_variables
from tests.promtools import binary

ROOT = Path(__file__).parents[2]
MODEL = json.loads((ROOT / "grafana" / "procdelta.json").read_text())
PANELS = [p for p in MODEL["panels"] if p["type"] != "row"]
EXPRESSIONS = [(p["title"], t["expr"]) for p in PANELS for t in p["targets"]]
SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\{([^{}]*)\}")
POD_SERIES = re.compile(r"^(node_namespace_pod:|namespace_workload_pod:|procdelta_footprint_)")
OWNER = "namespace_workload_pod:procdelta_pod_owner:relabel"
"""The rules' pod -> workload map, which the panels join on to keep selected workloads."""
SELF_COUNTERS = {
    "procdelta_pass_duration_seconds_bucket",
    "procdelta_passes_total",
    "procdelta_dropped_deltas_total",
    "procdelta_dropped_thread_deltas_total",
    "procdelta_dropped_cgroup_deltas_total",
}
"""procdelta's own counters, one per node: the only ones a panel takes a rate() of."""


def blank_selectors(expr: str) -> str:
    """The query with the insides of its label selectors blanked (their `/` and `>` are
    not operators)."""
    return SELECTOR.sub(lambda m: (m.group(1) or "") + "{}", expr)


def closing(text: str, start: int) -> int:
    """The index of the parenthesis that closes the one at `start`."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise AssertionError(f"unbalanced: {text[start:]}")


def divisors(expr: str) -> list[str]:
    """The right operand of every `/` of a query: a number, or a parenthesised expression
    (a vector matching clause `on (...)`, `group_left (...)` skipped)."""
    text, found = blank_selectors(expr), []
    for match in re.finditer(r"/", text):
        rest = text[match.end() :].lstrip()
        while clause := re.match(r"(on|ignoring|group_left|group_right)\s*\(", rest):
            rest = rest[closing(rest, clause.end() - 1) + 1 :].lstrip()
        if number := re.match(r"[0-9.]+(e[0-9]+)?", rest):
            found.append(number.group(0))
        elif rest.startswith("("):
            found.append(rest[: closing(rest, 0) + 1])
        else:
            found.append(rest.split()[0] if rest.split() else rest)
    return found


def test_every_division_is_by_a_constant_or_guarded():
    """An idle pod shows no value, never NaN or Inf: each divisor is a number or `(x > 0)`."""
    for title, expr in EXPRESSIONS:
        for divisor in divisors(expr):
            guarded = re.fullmatch(r"\(.*>\s*0\s*\)", divisor, re.S)
            assert re.fullmatch(r"[0-9.]+(e[0-9]+)?", divisor) or guarded, (title, divisor)


def test_divisors_are_found():
    """The reader of divisions above sees what it must refuse."""
    assert divisors("a / b") == ["b"]
    assert divisors("a / (b + c)") == ["(b + c)"]
    assert divisors('a{x="/"} / on (n) group_left (m) (b > 0) / 1e9') == ["(b > 0)", "1e9"]


def test_every_selector_of_pods_has_pod_set():
    """A per-pod series is read only where `pod` is set: a pod whose names procdelta did not
    find (empty `pod`) is not one pod with all the others like it."""
    for title, expr in EXPRESSIONS + [("variables", q) for q in variable_definitions()]:
        for metric, labels in SELECTOR.findall(expr):
            if POD_SERIES.match(metric) or "$pod" in labels:
                assert 'pod!=""' in labels, (title, metric, labels)


def test_every_rate_asks_for_the_selected_pods_or_nodes_only():
    """A panel takes a rate() of the per-group counters (one series per pod, per container,
    per cgroup of every node) only over the selected namespace's pods or the selected nodes
    (their selector carries `$namespace` or `$node`, which default to one), never over the
    cluster's; procdelta's own per-node counters are taken a rate() of as they are."""
    rates = re.compile(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)(\{[^{}]*\})?")
    for title, expr in EXPRESSIONS:
        for metric, labels in rates.findall(expr):
            assert metric in SELF_COUNTERS or "$namespace" in labels or "$node" in labels, (
                title,
                metric,
            )
        if "$pod" in expr:
            assert (
                "node_namespace_pod:" in expr
                or "procdelta_footprint_" in expr
                or ("$namespace" in expr)
            ), title


def test_every_series_a_panel_reads_is_of_the_selected_nodes_or_namespaces():
    """At 1,000 nodes a panel that reads a series of the whole cluster, a recorded one as
    much as a counter, is 110,000 rows: every selector of one of procdelta's series (its
    counters and gauges, and the rules' records) in a panel carries `$node` or
    `$namespace` (both default to one value), whatever the panel does with it after."""
    for title, expr in EXPRESSIONS:
        for metric, labels in SELECTOR.findall(expr):
            if "procdelta" in metric:
                assert "$node" in labels or "$namespace" in labels, (title, metric, labels)


def test_opened_from_a_node_page_the_panels_show_that_node():
    """A node page's `dashboard_url` sets `var-node` and, for each of its starved pods (the
    five the text names), `var-namespace` and `var-pod` (deploy/prometheus/*.test.yml hold
    the URLs): pods of that node. So every selector of procdelta's series in a panel carries
    `$node` or `$pod`, but the pod -> workload map (a filter that keeps the selected pods of
    the selected workloads) and the panels of workloads, whose pods run on many nodes."""
    for title, expr in EXPRESSIONS:
        if title.startswith("Workload"):
            continue
        for metric, labels in SELECTOR.findall(expr):
            if "procdelta" in metric and metric != OWNER:
                assert "$node" in labels or 'pod=~"$pod"' in labels, (title, metric, labels)


def variable_definitions() -> list[str]:
    return [v["definition"] for v in MODEL["templating"]["list"] if v["type"] == "query"]


def test_variables_are_a_chain():
    """cluster -> namespace -> workload -> pod, each filtered by every one before it, and a
    node within the cluster; each "All" the regex `.*` (which matches an absent label too);
    the namespace and the node at their first value, without "All", until the user widens
    them (a big cluster's panels ask for one namespace's pods, one node's). Every query
    that reads the
    selected pods keeps only those of the selected workloads."""
    found = [v for v in MODEL["templating"]["list"] if v["type"] == "query"]
    assert [v["name"] for v in found] == list(VARIABLES)
    chain = [v for v in found if v["name"] != "node"]
    names = [v["name"] for v in chain]
    for position, variable in enumerate(chain):
        used = set(re.findall(r"\$(\w+)", variable["definition"]))
        assert used == set(names[:position]), variable["name"]
    (node,) = [v for v in found if v["name"] == "node"]
    assert set(re.findall(r"\$(\w+)", node["definition"])) == {"cluster"}
    for variable in found:
        first = variable["name"] in ("namespace", "node")
        assert (variable["current"] == {}) == first, variable["name"]
        # Grafana 11's scenes open a variable with "All" and no value on All, whatever
        # `current` says (defaultToAll follows includeAll): the two that open on their
        # first value have none
        assert variable["includeAll"] is not first, variable["name"]
        assert variable.get("allValue") == (None if first else ".*"), variable["name"]
    for title, expr in EXPRESSIONS:
        assert set(re.findall(r"\$(\w+)", expr)) <= {*VARIABLES, "__rate_interval"}, title
        if "$pod" in expr:
            assert "$workload" in expr and "$cluster" in expr, title


def test_panels_fit_the_grid():
    cells: set[tuple[int, int]] = set()
    for panel in MODEL["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    assert len({p["id"] for p in MODEL["panels"]}) == len(MODEL["panels"])
    for panel in PANELS:
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        assert all(t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                   for t in panel["targets"])  # fmt: skip


# -- every query over the rules -------------------------------------------------------------

FIELDS = (
    "on_cpu_nanos", "run_delay_nanos", "run_delay_throttled_nanos",
    "run_delay_own_threads_nanos", "run_delay_neighbours_nanos", "run_delay_runnable_nanos",
    "observed_nanos",
    "cgroup_cpu_nanos", "cpu_periods", "cpu_throttled_periods", "cpu_throttled_nanos",
    "read_bytes", "write_bytes", "voluntary_switches", "nonvoluntary_switches",
    "cpu_pressure_waiting_nanos", "memory_pressure_waiting_nanos", "io_pressure_waiting_nanos",
)  # fmt: skip
NODES = {"n1": ("web-a", "db-0"), "n2": ("web-b",)}
KERNEL_CAUSES = (
    "cpu_stalled_throttled_nanos",
    "cpu_stalled_neighbours_nanos",
    "cpu_waiting_own_threads_nanos",
)
"""Why a pod waited from its cgroup's CPU pressure, in place of its run delay's split
(`run_delay_*`), which the nodes named here have (the others have the split)."""
PRESSURE_NODES = {"n1"}


def fleet(cluster: str | None, nodes: dict[str, tuple[str, ...]] = NODES) -> list[dict]:
    """Two nodes' procdelta series, as the scrape gives them: busy pods, processes outside
    pods, procdelta's own series; a `cluster` label on each where one is given."""
    where = f'cluster="{cluster}",' if cluster else ""
    series = []

    def add(metric: str, labels: str, values: str) -> None:
        series.append({"series": f"{metric}{{{where}{labels}}}", "values": values})

    for node, pods in nodes.items():
        job = f'job="procdelta",instance="{node}:9746",node="{node}"'
        for pod in pods:
            labels = f'namespace="shop",pod="{pod}",uid="u-{pod}",qos="burstable",{job}'
            fields = list(FIELDS)
            if node in PRESSURE_NODES:
                fields = [
                    f for f in fields if not f.startswith("run_delay_") or f == "run_delay_nanos"
                ]
                fields += [*KERNEL_CAUSES, "cpu_pressure_stalled_nanos"]
            starving = {"cgroup_cpu_nanos", *KERNEL_CAUSES, "cpu_pressure_stalled_nanos"}
            for field in fields:
                if field not in starving:
                    add(f"procdelta_{field}_total", labels, "0+1000000000x30")
            # half a core and, on either basis, half of the time it had work behind its
            # neighbours: starved, so that its node's count has data
            add("procdelta_cgroup_cpu_nanos_total", labels, "0+30000000000x30")
            if node in PRESSURE_NODES:
                for field in (*KERNEL_CAUSES, "cpu_pressure_stalled_nanos"):
                    add(f"procdelta_{field}_total", labels, "0+30000000000x30")
            for gauge in ("processes", "threads", "rss_bytes"):
                add(f"procdelta_footprint_{gauge}", labels, "3x30")
        outside = f'cgroup="/system.slice/sshd.service",{job}'
        add("procdelta_on_cpu_nanos_total", outside, "0+500000000x30")
        add("procdelta_run_delay_nanos_total", outside, "0+100000000x30")
        add("procdelta_build_info", f'version="test",{job}', "1x30")
        add("procdelta_node_cpus", job, "2x30")
        add("procdelta_passes_total", job, "0+60x30")
        for le, count in (("0.1", "0+50x30"), ("+Inf", "0+60x30")):
            add("procdelta_pass_duration_seconds_bucket", f'le="{le}",{job}', count)
        for name in ("dropped_deltas", "dropped_thread_deltas", "dropped_cgroup_deltas"):
            add(f"procdelta_{name}_total", f'reason="vanished",{job}', "0+5x30")
        add("procdelta_source_available", f'source="schedstat",{job}', "1x30")
        add("procdelta_tracked_processes", job, "100x30")
        add("procdelta_tracked_threads", job, "300x30")
    return series


def returns_data(query: str) -> dict:
    return {"expr": f"absent(\n{query}\n)", "eval_time": "20m", "exp_samples": []}


def promtool_test(tmp_path: Path, case: dict) -> subprocess.CompletedProcess:
    tests = tmp_path / "dashboard.test.yml"
    tests.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [case]})
    )
    return subprocess.run(
        [binary("promtool"), "test", "rules", str(tests)], capture_output=True, text=True
    )


@pytest.mark.parametrize("cluster", [None, "east"], ids=["no cluster label", "cluster label"])
def test_every_query_returns_data_over_the_rules(tmp_path, cluster):
    """Every panel's and variable's query, as for "All" and with a pod chosen, returns
    data over the rules, with or without a `cluster` label on the series."""
    chosen = {"namespace": "shop", "workload": "web-a", "pod": "web-a"}  # on a PSI node
    if cluster:
        chosen["cluster"] = cluster
    queries = dashboard_queries(window="5m") + dashboard_queries(window="5m", **chosen)
    case = {"interval": "1m", "input_series": fleet(cluster)}
    case["promql_expr_test"] = [returns_data(q) for q in queries]
    result = promtool_test(tmp_path, case)
    assert result.returncode == 0, result.stdout + result.stderr


def test_clusters_keep_their_nodes_apart(tmp_path):
    """Two clusters whose nodes have the same names, every cluster shown: a pod chosen in
    one, its neighbours and its node's processes outside pods are that cluster's only."""
    title = "Neighbours: cores used per pod on the selected nodes"
    (neighbours, outside) = (t["expr"] for p in PANELS if p["title"] == title for t in p["targets"])
    chosen = {"pod": "web-a"}
    expected = [
        {"labels": f'{{cluster="east",namespace="shop",node="n1",pod="{pod}"}}', "value": 1}
        for pod in NODES["n1"]
    ]
    case = {
        "interval": "1m",
        "input_series": fleet("east") + fleet("west", {"n1": ("batch-x",), "n2": ("batch-y",)}),
        "promql_expr_test": [
            {
                "expr": "count by (cluster, node, namespace, pod) ("
                f"{set_variables(neighbours, '5m', **chosen)})",
                "eval_time": "20m",
                "exp_samples": expected,
            },
            {
                "expr": f"count by (cluster, node) ({set_variables(outside, '5m', **chosen)})",
                "eval_time": "20m",
                "exp_samples": [{"labels": '{cluster="east",node="n1"}', "value": 1}],
            },
        ],
    }
    result = promtool_test(tmp_path, case)
    assert result.returncode == 0, result.stdout + result.stderr


def test_nanoseconds_become_seconds_and_cores_by_1e9():
    """Every constant a query divides by is 1e9 (ns per second: cores, seconds per
    second), and every panel of cores divides its nanoseconds so: a 1e6 would ship panels
    a thousand times off."""
    constants = [c for _, expr in EXPRESSIONS for c in re.findall(r"/\s*(1e\d+)", expr)]
    assert constants and set(constants) == {"1e9"}
    cores = [(t, e) for t, e in EXPRESSIONS if re.match(r"(Workload |Neighbours: )?[Cc]ores", t)]
    assert len(cores) >= 5 and all("/ 1e9" in expr for _, expr in cores), cores

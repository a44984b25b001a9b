"""deploy/, the rules, the dashboard and the Dockerfile, each checked by the real tool.

The queries of the dashboard and the recording rules are evaluated against a real
Prometheus scraping a real procdelta in tests/kernel/test_end_to_end.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from tests.manifests import assert_least_privilege, assert_paths_from_env
from tests.promtools import binary

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "procdelta.rules.yml"
KUBERNETES_VERSION = "1.33.0"  # the oldest Kubernetes release the manifests promise
CUSTOM_RESOURCES = {"servicemonitor.yaml", "prometheusrule.yaml"}


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def manifests() -> list[str]:
    return sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_kustomization_lists_every_manifest():
    assert sorted(load("kustomization.yaml")["resources"]) == manifests()


@pytest.mark.parametrize("name", [m for m in manifests() if m not in CUSTOM_RESOURCES])
def test_manifest_validates_against_the_kubernetes_schema(name):
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
         KUBERNETES_VERSION, str(DEPLOY / name)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


def test_service_monitor_selects_the_service_and_its_port():
    service, monitor = load("service.yaml"), load("servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_service_selects_the_daemonset_pods():
    service, daemonset = load("service.yaml"), load("daemonset.yaml")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


def test_daemonset_runs_with_the_least_privilege_that_works():
    daemonset = load("daemonset.yaml")
    assert_least_privilege(daemonset)
    assert_paths_from_env(daemonset)
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"


def test_prometheus_rule_carries_the_rule_file():
    rule = load("prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_promtool_checks_the_rules():
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


RULE_TESTS = [
    RULES.with_name("procdelta.rules.test.yml"),
    RULES.with_name("procdelta.workload.rules.test.yml"),
    RULES.with_name("procdelta.causes.rules.test.yml"),
    RULES.with_name("procdelta.pages.rules.test.yml"),
    RULES.with_name("procdelta.owed.rules.test.yml"),
    RULES.with_name("procdelta.holders.rules.test.yml"),
    RULES.with_name("procdelta.tickets.rules.test.yml"),
]


def rule_names() -> set[str]:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return {r.get("record") or r["alert"] for r in rules}


def test_promtool_unit_tests_every_recording_rule_and_alert():
    names, tested = rule_names(), set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for test in case.get("promql_expr_test", []):
                tested |= {
                    name
                    for name in names
                    if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", test["expr"])
                }
            tested |= {t["alertname"] for t in case.get("alert_rule_test", [])}
    assert names == tested
    result = subprocess.run(
        [binary("promtool"), "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_plain_scrape_config_is_valid_prometheus_configuration(tmp_path):
    """Debian's Prometheus is built without Kubernetes discovery, so promtool checks the
    job with the discovery swapped for a static target; the discovery part is checked
    for what it must say."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yml").read_text())
    (job,) = config["scrape_configs"]
    (discovery,) = job.pop("kubernetes_sd_configs")
    assert discovery["role"] == "pod"
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert {r["source_labels"][0] for r in keep} == {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name",
        "__meta_kubernetes_pod_container_port_name",
    }
    job["static_configs"] = [{"targets": ["127.0.0.1:9746"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [binary("promtool"), "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_plain_scrape_config_sets_node_as_the_monitors_do():
    """The per-node rules and the neighbours panel group by `node`: the plain job sets it
    from the pod's node name, as the ServiceMonitor's (and PodMonitor's) first relabeling."""
    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yml").read_text())[
        "scrape_configs"
    ]
    node = [r for r in job["relabel_configs"] if r.get("target_label") == "node"]
    assert node == [{"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}]
    (endpoint,) = load("servicemonitor.yaml")["spec"]["endpoints"]
    assert endpoint["relabelings"][0] == {
        "sourceLabels": node[0]["source_labels"],
        "targetLabel": node[0]["target_label"],
    }
    # and nothing after it overwrites it
    later = job["relabel_configs"][job["relabel_configs"].index(node[0]) + 1 :]
    assert all(r.get("target_label") != "node" for r in later)


def test_dashboard_json_is_the_generators_output():
    sys.path.insert(0, str(ROOT / "grafana"))
    try:
        import dashboard
    finally:
        sys.path.pop(0)
    committed = (ROOT / "grafana" / "procdelta.json").read_text()
    assert committed == dashboard.render(), "run `python grafana/dashboard.py` and commit"
    model = json.loads(committed)
    assert [v["name"] for v in model["templating"]["list"]] == [
        "datasource", *VARIABLES,
    ]  # fmt: skip
    titles = {p["title"] for p in model["panels"]}
    for wanted in ("CPU starvation", "Cores used", "Run delay", "Storage I/O",
                   "Context switches", "Processes and threads",
                   "Pass duration", "Dropped deltas", "Throttled share of CPU periods",
                   "CPU wait by cause, per pod", "CPU wait: own CPU limit",
                   "CPU wait: own threads", "CPU wait: neighbours", "Waiting by cause",
                   "Coverage: on-CPU seen by the sums / the cgroup's CPU",
                   "Pressure (PSI some): share of time some task waited",
                   "Sources the nodes provide",
                   "Workloads: pods affected, starvation, throttled share, cores",
                   "Workload pods starved and throttled (share of its pods)",
                   "Neighbours: cores used per pod on the selected nodes",
                   "Node saturation: starved pods, runnable threads per CPU",
                   ):  # fmt: skip
        assert wanted in titles


def dashboard_queries(**chosen: str) -> list[str]:
    """Every PromQL query of the dashboard, variables set as for "All" (or as chosen)."""
    model = json.loads((ROOT / "grafana" / "procdelta.json").read_text())
    queries = [t["expr"] for p in model["panels"] for t in p.get("targets", [])]
    for variable in model["templating"]["list"]:
        definition = variable.get("definition", "")
        if definition.startswith("label_values("):
            queries.append(definition[len("label_values(") :].rsplit(",", 1)[0])
    return [set_variables(q, **chosen) for q in queries]


VARIABLES = ("cluster", "node", "namespace", "workload", "pod")
"""The dashboard's variables: the node, and the chain cluster -> namespace -> workload ->
pod, each filtered by those before it."""


def set_variables(query: str, window: str = "15s", **chosen: str) -> str:
    """A dashboard query with its variables set: each to a value chosen, or as for "All"."""
    unknown = set(chosen) - set(VARIABLES)
    assert not unknown, f"the dashboard has no variable {unknown}"
    query = query.replace("$__rate_interval", window)
    for name in VARIABLES:
        query = query.replace(f"${name}", chosen.get(name, ".*"))
    return query


def test_neighbours_are_those_of_the_selected_pods_nodes(tmp_path):
    """The neighbours panel, evaluated by promtool over the rules on two nodes: the pods of
    the chosen pod's node ranked by their cgroups' CPU, and the processes outside pods there.
    A pod chosen whose processes never outlive a pass (cgroup counters alone) still has its
    node's pods as neighbours; one whose cgroup procdelta does not read (process counters
    alone) is no pod the rules saw, and has none; a workload chosen, its pods' nodes only."""
    model = json.loads((ROOT / "grafana" / "procdelta.json").read_text())
    title = "Neighbours: cores used per pod on the selected nodes"
    (panel,) = [p for p in model["panels"] if p["title"] == title]
    neighbours, outside = (t["expr"] for t in panel["targets"])

    def series(metric: str, node: str, pod: str = "") -> dict:
        group = f'namespace="batch",pod="{pod}",uid="u-{pod}"' if pod else 'cgroup="/system.slice"'
        labels = f'{group},job="procdelta",node="{node}"'
        return {"series": f"{metric}{{{labels}}}", "values": "0+30000000000x20"}

    def neighbours_of(pods: set[str], **chosen: str) -> dict:
        expr = f"count by (node, namespace, pod) ({set_variables(neighbours, '5m', **chosen)})"
        node = "n2" if pods == {"s"} else "n1"
        samples = [
            {"labels": f'{{namespace="batch",node="{node}",pod="{pod}"}}', "value": 1}
            for pod in sorted(pods)
        ]
        return {"expr": expr, "eval_time": "10m", "exp_samples": samples}

    def outside_of(**chosen: str) -> dict:
        expr = f"count by (node) ({set_variables(outside, '5m', **chosen)})"
        samples = [{"labels": '{node="n1"}', "value": 1}]
        return {"expr": expr, "eval_time": "10m", "exp_samples": samples}

    tests = tmp_path / "neighbours.test.yml"
    case = {
        "interval": "1m",
        "input_series": [
            series("procdelta_cgroup_cpu_nanos_total", "n1", "q"),
            series("procdelta_on_cpu_nanos_total", "n1", "r"),
            series("procdelta_cgroup_cpu_nanos_total", "n1", "r"),
            series("procdelta_on_cpu_nanos_total", "n1", "t"),
            series("procdelta_on_cpu_nanos_total", "n1"),
            series("procdelta_on_cpu_nanos_total", "n2", "s"),
            series("procdelta_cgroup_cpu_nanos_total", "n2", "s"),
            series("procdelta_on_cpu_nanos_total", "n2"),
        ],
        "promql_expr_test": [
            neighbours_of({"q", "r"}, pod="q"),
            {**neighbours_of(set(), pod="t"), "exp_samples": []},
            neighbours_of({"q", "r"}, workload="q"),
            neighbours_of({"s"}, workload="s"),
            neighbours_of({"s"}, namespace="batch", pod="s"),
            outside_of(pod="q"),
        ],
    }
    tests.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [case]})
    )
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(tests)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def recording_rule_queries() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"] if "record" in r]


def test_dockerfile_lints_clean():
    result = subprocess.run(
        ["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_build_steps_give_a_working_command(tmp_path):
    """What the Dockerfile's build stage does: a wheel, installed into a clean venv."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(wheels), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("procdelta-*.whl")
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    pip = target / "bin" / "pip"
    subprocess.run([str(pip), "install", "--quiet", str(wheel)], check=True, timeout=600)
    result = subprocess.run(
        [str(target / "bin" / "procdelta"), "--help"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 0, result.stderr
    for command in ("serve", "once", "bench"):
        assert command in result.stdout


def test_a_node_page_of_forty_pods_says_who_held_and_the_command_within_1000_characters():
    """A receiver that cuts a page's text at 1,000 characters (PagerDuty's summary, a Slack
    preview) keeps who held the CPUs beyond their entitlement and the command to run: the
    description promtool checks for a node of forty owed pods
    (procdelta.holders.rules.test.yml), cut there."""
    case = next(
        case
        for case in yaml.safe_load(RULES.with_name("procdelta.holders.rules.test.yml").read_text())[
            "tests"
        ]
        if case["name"].startswith("a node of forty owed pods")
    )
    ((alert,),) = [t["exp_alerts"] for t in case["alert_rule_test"]]
    kept = alert["exp_annotations"]["description"][:1000]
    held = kept.partition("Held beyond their entitlement by: ")[2].partition(". ")[0]
    assert held.startswith("batch/hog 21.00 cores over, /system.slice/agent.service"), kept
    assert "procdelta top --from http://127.0.0.1:9746 --sort on_cpu_nanos" in kept
    assert "and 35 more" in kept  # the starved pods cut at five, not the page


KEEP_FIRING_TESTS = {"procdelta.workload.rules.test.yml"}
"""The rule tests whose verdicts are keep_firing_for's (an alert outlasting its pods): the
vmalert file has none, by design."""


def test_the_rule_tests_hold_for_the_vmalert_file_too(tmp_path):
    """deploy/prometheus/procdelta.vmalert.rules.yml, the same rules without keep_firing_for,
    gives every shape of the rule tests its verdict (promtool evaluates it as Prometheus
    would; MetricsQL's own evaluation is tests/kernel/test_vmalert.py's): the pages that
    replace each other, the node lost from sight, the tickets."""
    vmalert = RULES.with_name("procdelta.vmalert.rules.yml")
    (tmp_path / "procdelta.rules.yml").write_text(vmalert.read_text())
    tests = [path for path in RULE_TESTS if path.name not in KEEP_FIRING_TESTS]
    assert len(tests) == len(RULE_TESTS) - len(KEEP_FIRING_TESTS)
    for path in tests:
        (tmp_path / path.name).write_text(path.read_text())
    result = subprocess.run(
        [binary("promtool"), "test", "rules", *(path.name for path in tests)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


def episode_pages(tmp_path: Path, share: float, node_for: str = "15m") -> bool:
    """Whether one 15-minute episode makes its node page, under the rules with the node
    page's `for:` set to `node_for`: an owed pod (1 core of work a second, within its 2-core
    request) that waits for its neighbours a `share` of that time through the episode (its
    CPU the rest), none before or after. The shape of docs/findings.md's page budget."""
    work = 60e9  # ns a minute: on a CPU or waiting for one
    cpu, stall = work * (1 - share), work * share

    def counter(per_minute: float, outside: float) -> str:
        total, values = 0.0, []
        for minute in range(61):
            values.append(str(int(total)))
            total += per_minute if 10 <= minute < 25 else outside
        return " ".join(values)

    labels = 'node="b1",namespace="shop",pod="web",uid="u-web",qos="burstable",job="procdelta"'
    series = {
        'up{job="procdelta",node="b1"}': "1x60",
        f"procdelta_cgroup_cpu_nanos_total{{{labels}}}": counter(cpu, work),
        f"procdelta_cpu_pressure_stalled_nanos_total{{{labels}}}": counter(stall, 0),
        f"procdelta_cpu_stalled_neighbours_nanos_total{{{labels}}}": counter(stall, 0),
        f"procdelta_cpu_stalled_throttled_nanos_total{{{labels}}}": "0x60",
        f"procdelta_cpu_waiting_own_threads_nanos_total{{{labels}}}": "0x60",
        'kube_pod_container_resource_requests{namespace="shop",pod="web",uid="u-web",'
        'container="app",node="b1",resource="cpu",unit="core"}': "2x60",
    }
    rules = RULES.read_text()
    page = rules.index("alert: ProcdeltaNodeCPUSaturated\n")
    at = rules.index("for: 15m\n", page)
    (tmp_path / "rules.yml").write_text(f"{rules[:at]}for: {node_for}\n{rules[at + 9 :]}")
    fired = 'ALERTS{alertname="ProcdeltaNodeCPUSaturated", alertstate="firing"}'
    case = {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "promql_expr_test": [
            {"expr": f"count_over_time({fired}[60m]) > 0", "eval_time": "59m", "exp_samples": []}
        ],
    }
    test = tmp_path / "episode.test.yml"
    test.write_text(
        yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [case]})
    )
    result = subprocess.run(
        [binary("promtool"), "test", "rules", str(test)], capture_output=True, text=True
    )
    # it paged where the expectation of no page failed, and on that alone (not on a bad file)
    paged = result.returncode != 0
    assert not paged or 'got: {alertname="ProcdeltaNodeCPUSaturated"' in result.stderr, result
    return paged


def test_a_15_minute_episode_pages_only_past_half_its_time_and_not_at_for_20m(tmp_path):
    """docs/findings.md's budget: over a 15-minute episode the page's 5-minute rate of the
    neighbours' share is over 25 % for 20 - 2.5/share minutes, past `for: 15m` only where the
    pod waited about half its time or more (0.4: 13.75 minutes, 0.7: 16.4); at `for: 20m` no
    15-minute episode pages (17.5 minutes at most, at 1; 0.85, 17.1, is as deep as a pod
    still busy enough for the pod alert's 0.1 core goes)."""
    assert not episode_pages(tmp_path, 0.4)
    assert episode_pages(tmp_path, 0.7)
    assert episode_pages(tmp_path, 0.85)
    assert not episode_pages(tmp_path, 0.85, node_for="20m")

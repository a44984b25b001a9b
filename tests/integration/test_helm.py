"""The Helm chart (deploy/helm/procdelta), rendered and linted by Helm's own engine.

helm-python-sdk binds Helm v4's Go SDK: the same template engine, lint and schema
validation as the `helm` command. Each rendering is checked by the tool made for it:
kubernetes-validate for the Kubernetes objects, promtool for the rules; the Prometheus
Operator's objects structurally. The kustomize base and the plain rule file are the
chart rendered (deploy/generate.py); the last tests fail when they are stale.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import helm_python
import pytest
import yaml

from tests.manifests import assert_least_privilege, assert_paths_from_env, environment
from tests.net import free_port, request, wait_until
from tests.promtools import binary

ROOT = Path(__file__).parents[2]
CHART = ROOT / "deploy" / "helm" / "procdelta"
KUBERNETES_VERSION = "1.33.0"  # the oldest Kubernetes release the chart promises
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
VALUES = {
    "default": {},
    "all-on": yaml.safe_load((CHART / "ci" / "all-on-values.yaml").read_text()),
    "options": yaml.safe_load((CHART / "ci" / "options-values.yaml").read_text()),
}


def _generator():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "deploy" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()


def render(values: dict, name: str = "procdelta", namespace: str = "monitoring") -> dict:
    """{kind: [objects]} of the chart rendered with these values."""
    objects: dict[str, list[dict]] = {}
    for text in generate.render(values, name=name, namespace=namespace).values():
        for document in yaml.safe_load_all(text):
            if document:
                objects.setdefault(document["kind"], []).append(document)
    return objects


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendering(request) -> tuple[str, dict]:
    return request.param, render(VALUES[request.param])


def only(objects: dict, kind: str) -> dict:
    (found,) = objects[kind]
    return found


# -- lint and schema ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUES))
def test_helm_lint_is_clean(name):
    report = helm_python.lint(
        CHART, VALUES[name], strict=True, kube_version=f"v{KUBERNETES_VERSION}"
    )
    assert report["errors"] == []
    # severity 1 is "info": the only one is Chart.yaml's missing icon
    assert [m for m in report["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("name", sorted(VALUES))
def test_schema_accepts_the_values_files(name):
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values(VALUES[name]))


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"procdelta": {"interval": "15"}}, "/procdelta/interval"),
        ({"intervall": 15}, "additional properties 'intervall'"),
        ({"procdelta": {"perContainers": True}}, "additional properties 'perContainers'"),
        ({"service": {"port": 70000}}, "/service/port"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        (
            {"prometheusRule": {"alerts": {"podCPUStarved": {"neighboursShare": "25%"}}}},
            "/podCPUStarved/neighboursShare",
        ),
        ({"prometheusRule": {"alerts": {"podCPUThrottled": {"waitShare": 1.5}}}}, "waitShare"),
        ({"prometheusRule": {"alerts": {"targetDown": {"for": "5 minutes"}}}}, "/targetDown/for"),
        (
            {"prometheusRule": {"alerts": {"podCPUStarved": {"starvation": 0.25}}}},
            "additional properties 'starvation'",
        ),
        ({"prometheusRule": {"alerts": {"workloadCPUStarved": {"podShare": 1.5}}}}, "podShare"),
        ({"prometheusRule": {"alerts": {"podCPUStarved": {"enabled": "no"}}}}, "enabled"),
        ({"prometheus": {"monitor": {"enabled": "yes"}}}, "/prometheus/monitor/enabled"),
    ],
)
def test_schema_rejects_wrong_values(values, complaint):
    with helm_python.Chart.load(CHART) as chart:
        with pytest.raises(helm_python.HelmValuesError, match=complaint):
            chart.validate_schema(chart.merge_values(values))
        # and an install refuses them the same way
        with pytest.raises(helm_python.HelmValuesError, match=complaint):
            chart.render(values, name="procdelta", namespace="monitoring")


def test_every_value_is_in_the_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def missing(values: dict, node: dict, prefix: str) -> list[str]:
        found = []
        for key, value in values.items():
            child = node.get("properties", {}).get(key)
            if child is None:
                found.append(prefix + key)
            elif isinstance(value, dict) and "properties" in child:
                found += missing(value, child, f"{prefix}{key}.")
        return found

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert missing(values, schema, "") == []


# -- what is rendered ----------------------------------------------------------------------


def test_rendered_objects_validate_against_the_kubernetes_schema(rendering, tmp_path):
    _, objects = rendering
    paths = []
    for kind, found in objects.items():
        if kind in OPERATOR_KINDS:
            continue
        for index, document in enumerate(found):
            path = tmp_path / f"{kind}-{index}.yaml"
            path.write_text(yaml.safe_dump(document))
            paths.append(str(path))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
         KUBERNETES_VERSION, *paths],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(paths), result.stdout


def test_default_rendering_is_the_least_privileged_node_agent():
    objects = render({})
    assert set(objects) == {"DaemonSet", "Service", "ServiceAccount"}
    daemonset = only(objects, "DaemonSet")
    assert_least_privilege(daemonset)
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"procdelta:{generate.version()}"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    account = only(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    service = only(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert (
        service["spec"]["selector"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )
    assert daemonset["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_every_rendering_keeps_the_least_privilege(rendering):
    name, objects = rendering
    paths = VALUES[name].get("hostPaths", {})
    assert_least_privilege(
        only(objects, "DaemonSet"),
        procfs=paths.get("proc", "/proc"),
        cgroupfs=paths.get("cgroupfs", "/sys/fs/cgroup"),
    )
    assert_paths_from_env(only(objects, "DaemonSet"))


def test_options_reach_the_pod():
    objects = render(VALUES["options"])
    daemonset = only(objects, "DaemonSet")
    assert daemonset["metadata"]["name"] == "node-counters"
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == (
        "registry.example.com/platform/procdelta:edge@sha256:"
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    )
    assert container["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    args = container["args"]
    for wanted in ("--interval=30", "--log.level=debug", "--log.format=json",
                   "--web.listen-address=:9800",
                   "--web.config.file=/etc/procdelta/web/web.yml",
                   "--web.max-requests=10", "--no-web.processes"):  # fmt: skip
        assert wanted in args
    assert args[-1] == "--no-export.interval-gauges"  # extraArgs come last: they win
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    env = environment(container)
    assert env["PROCDELTA_PATH_PROCFS"] == "/host/proc"  # extraEnv beside
    # the grouping and the cgroup switches by environment, so that `kubectl exec ...
    # procdelta top` groups as serve does
    assert (env["PROCDELTA_PER_CONTAINER"], env["PROCDELTA_PODS_ONLY"]) == ("true", "true")
    assert env["PROCDELTA_COLLECTOR_CGROUP"] == "true"
    assert env["PROCDELTA_COLLECTOR_CGROUP_PRESSURE"] == "false"
    assert not [a for a in args if "per-container" in a or "pods-only" in a or "cgroup" in a]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9800, "protocol": "TCP"}]
    # the Secret mounted read-only where the flag points; probes cannot pass basic auth
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/procdelta/web")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"] == {"secretName": "procdelta-web"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "metrics"}
    assert container["resources"]["limits"]["memory"] == "192Mi"
    (endpoint,) = only(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "procdelta"


def test_the_fleet_profile_ships_the_counters_and_cpu_pressure_alone():
    """`procdelta.profile: fleet` turns the interval gauges and memory and I/O pressure off
    by environment (so that `kubectl exec ... procdelta top` reads as serve does); the
    default leaves the full page."""

    def env(values: dict) -> dict[str, str]:
        daemonset = only(render(values), "DaemonSet")
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        return environment(container)

    fleet = env({"procdelta": {"profile": "fleet"}})
    assert fleet["PROCDELTA_EXPORT_INTERVAL_GAUGES"] == "false"
    assert fleet["PROCDELTA_COLLECTOR_CGROUP_PRESSURE_CPU_ONLY"] == "true"
    full = env({})
    assert "PROCDELTA_EXPORT_INTERVAL_GAUGES" not in full
    assert "PROCDELTA_COLLECTOR_CGROUP_PRESSURE_CPU_ONLY" not in full
    with pytest.raises(helm_python.HelmError):
        render({"procdelta": {"profile": "small"}})


def test_exit_records_add_the_hosts_namespaces_and_net_admin_only_when_on():
    """`procdelta.exits`: the host's network and PID namespaces and NET_ADMIN beside the two
    capabilities, which listening for exit records needs (docs/deploy.md), and the switch by
    environment; off (the default), none of them."""
    daemonset = only(render({"procdelta": {"exits": True}}), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert (pod["hostPID"], pod["hostNetwork"]) == (True, True)
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = pod["containers"]
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["DAC_READ_SEARCH", "SYS_PTRACE", "NET_ADMIN"],
    }
    assert environment(container)["PROCDELTA_COLLECTOR_EXITS"] == "true"
    default = only(render({}), "DaemonSet")
    assert_least_privilege(default)
    (container,) = default["spec"]["template"]["spec"]["containers"]
    assert "PROCDELTA_COLLECTOR_EXITS" not in environment(container)
    assert "NET_ADMIN" not in str(default)


def test_every_procdelta_flag_the_chart_passes_exists():
    """The chart's flags against the CLI's own: a renamed flag would crash every pod."""
    from collector.cli import cli

    serve = cli.commands["serve"]
    flags = {flag for param in serve.params for flag in param.opts + param.secondary_opts}
    variables = {param.envvar for param in serve.params if param.envvar}
    for values in VALUES.values():
        (container,) = only(render(values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        assert container["args"][0] == serve.name
        for arg in container["args"][1:]:
            assert arg.split("=")[0] in flags, arg
        extra = {v["name"] for v in values.get("extraEnv", [])}
        for variable in environment(container).keys() - extra:
            assert variable in variables, variable


# -- the processes view ----------------------------------------------------------------------


@contextlib.contextmanager
def serving_as_rendered(daemonset: dict) -> Iterator[tuple[int, int]]:
    """The rendered DaemonSet's `procdelta serve` on this host: its arguments but the
    listen address (127.0.0.1), its environment with each mounted path the host's path it
    mounts; its port and PID."""
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"] for m in container["volumeMounts"]
    }
    env = {name: host.get(value, value) for name, value in environment(container).items()}
    port = free_port()
    args = [
        f"--web.listen-address=127.0.0.1:{port}" if a.startswith("--web.listen-address=") else a
        for a in container["args"]
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "collector", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 30, "a first pass")
        yield port, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        finally:
            process.kill()
            process.stderr.close()


def test_the_processes_view_is_on_by_default_and_a_value_turns_it_off(tmp_path):
    """By default the DaemonSet's serve answers `/processes`, listing serve itself under
    its own PID, without its storage bytes (no web configuration authenticates the client);
    `processes.storageBytes: true` serves them; `processes.enabled: false` renders
    `--no-web.processes`, and it answers 404."""
    logs = {"podLogs": str(tmp_path / "pods"), "containerLogs": str(tmp_path / "containers")}
    for path in logs.values():
        os.mkdir(path)
    values = {"procdelta": {"interval": 1}, "hostPaths": logs}
    default = only(render(values), "DaemonSet")
    assert "--no-web.processes" not in default["spec"]["template"]["spec"]["containers"][0]["args"]
    with serving_as_rendered(default) as (port, pid):

        def itself() -> dict | None:
            status, _, body = request(port, "/processes?limit=0")
            assert status == 200, body
            rows = [row for row in json.loads(body)["processes"] if row["pid"] == pid]
            return rows[0] if rows else None

        row = wait_until(itself, 30, "serve listing itself")
        assert row["threads"] >= 2 and row["on_cpu_nanos"] > 0
        with open(f"/proc/{pid}/comm") as comm:
            assert row["comm"] == comm.read().rstrip("\n")
        assert "write_bytes" not in row  # to no unauthenticated client by default
    opened = only(render({**values, "processes": {"storageBytes": True}}), "DaemonSet")
    assert (
        "--web.processes.storage-bytes"
        in opened["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    with serving_as_rendered(opened) as (port, pid):
        status, _, body = request(port, "/processes?sort=write_bytes&limit=0")
        assert status == 200, body
        assert all("write_bytes" in row for row in json.loads(body)["processes"])
    off = only(render({**values, "processes": {"enabled": False}}), "DaemonSet")
    (container,) = off["spec"]["template"]["spec"]["containers"]
    assert "--no-web.processes" in container["args"]
    with serving_as_rendered(off) as (port, _):
        status, _, body = request(port, "/processes")
        assert status == 404, body
        assert request(port, "/metrics")[0] == 200


def test_monitors_select_procdeltas_service_and_pods():
    objects = render(VALUES["all-on"])
    service = only(objects, "Service")
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    monitor, pod_monitor = only(objects, "ServiceMonitor"), only(render(PODMONITOR), "PodMonitor")
    for found in (monitor, pod_monitor):
        assert found["apiVersion"] == "monitoring.coreos.com/v1"
        assert found["metadata"]["labels"]["release"] == "kps"
        # job="procdelta" whatever the release is called: the alerts select it
        assert found["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "procdelta"
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["relabelings"][0] == {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
    }
    assert endpoint["relabelings"][2]["targetLabel"] == "instance"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] == "metrics"
    policy = only(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["egress"] == []
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_the_network_policy_admits_only_the_prometheus_namespace():
    """Opt-in; with `prometheusNamespace`, only that namespace's pods reach the port (and
    the peers of `from` beside them); by default no policy at all."""
    assert "NetworkPolicy" not in render({})
    policy = only(
        render({"networkPolicy": {"enabled": True, "prometheusNamespace": "monitoring"}}),
        "NetworkPolicy",
    )
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert policy["spec"]["egress"] == [] and policy["spec"]["policyTypes"] == [
        "Ingress",
        "Egress",
    ]
    peer = {"ipBlock": {"cidr": "10.0.0.0/24"}}
    both = render(
        {"networkPolicy": {"enabled": True, "prometheusNamespace": "mon", "from": [peer]}}
    )
    assert only(both, "NetworkPolicy")["spec"]["ingress"][0]["from"][1] == peer
    anywhere = render({"networkPolicy": {"enabled": True}})
    assert "from" not in only(anywhere, "NetworkPolicy")["spec"]["ingress"][0]


# all-on's values with the PodMonitor in place of the ServiceMonitor
PODMONITOR = {
    **VALUES["all-on"],
    "prometheus": {
        "monitor": {"enabled": False},
        "podMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
    },
}


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str]:
    """A target's labels through the Operator's relabelings (the actions the chart uses)."""
    labels = dict(labels)
    for config in configs:
        action = config.get("action", "replace")
        regex = re.compile(f"^(?:{config.get('regex', '(.*)')})$")
        if action == "replace":
            source = ";".join(labels.get(n, "") for n in config.get("sourceLabels", []))
            match = regex.match(source)
            if match:
                value = match.expand(config.get("replacement", "$1").replace("$", "\\"))
                if value:
                    labels[config["targetLabel"]] = value
                else:
                    labels.pop(config["targetLabel"], None)
        elif action == "labeldrop":
            labels = {k: v for k, v in labels.items() if not regex.match(k)}
        else:
            raise NotImplementedError(action)
    return labels


def scraped(target: dict[str, str], series: dict[str, str]) -> dict[str, str]:
    """A scraped series' labels as Prometheus stores them (honor_labels false): a target
    label the series has too wins, the series' own renamed `exported_<name>`."""
    kept = {k: v for k, v in target.items() if not k.startswith("__")}
    stored = {(f"exported_{k}" if k in kept else k): v for k, v in series.items()}
    return {**stored, **kept}


@pytest.mark.parametrize("values", ["all-on", "podmonitor"])
def test_monitors_keep_the_counted_pods_namespace_and_pod(values):
    """The Operator labels each target with procdelta's own pod (`namespace`, `pod`,
    `container`, before the monitor's relabelings); the monitors drop those, so that the
    series keep the namespace and pod procdelta counted, under their own names, and
    `node`."""
    objects = render(VALUES["all-on"] if values == "all-on" else PODMONITOR)
    if values == "all-on":
        (endpoint,) = only(objects, "ServiceMonitor")["spec"]["endpoints"]
    else:
        (endpoint,) = only(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][:2] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        {"action": "labeldrop", "regex": "(namespace|pod|container)"},
    ]
    target = {
        "__address__": "10.0.0.7:9746",
        "__meta_kubernetes_namespace": "procdelta",
        "__meta_kubernetes_pod_name": "procdelta-abc",
        "__meta_kubernetes_pod_node_name": "n1",
        "job": "procdelta",
        "instance": "10.0.0.7:9746",
        "namespace": "procdelta",
        "pod": "procdelta-abc",
        "container": "procdelta",
        "service": "procdelta",
        "endpoint": "metrics",
    }
    series = {"namespace": "shop", "pod": "web-a", "container": "app", "uid": "u-web-a"}
    stored = scraped(relabel(target, endpoint["relabelings"]), series)
    assert stored.items() >= {**series, "node": "n1", "job": "procdelta"}.items()
    assert not [k for k in stored if k.startswith("exported_")]
    # a series of no pod (a process outside pods) gets none of procdelta's own
    assert not {"namespace", "pod", "container"} & set(
        scraped(relabel(target, endpoint["relabelings"]), {"cgroup": "/system.slice/x"})
    )


def test_monitors_exclude_each_other():
    """Both monitors would scrape every series twice (every sum doubled): refused."""
    both = {"prometheus": {"monitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    with pytest.raises(Exception, match="enable one"):
        render(both)


def test_dashboard_configmap_is_the_dashboard():
    config_map = only(render(VALUES["all-on"]), "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Nodes"}
    committed = (ROOT / "grafana" / "procdelta.json").read_text()
    assert config_map["data"]["procdelta.json"] == committed.rstrip("\n")
    assert json.loads(config_map["data"]["procdelta.json"])["title"]


def test_the_dashboard_names_the_cluster_label_the_rules_keep():
    """prometheusRule.clusterLabel is the label the dashboard's variables, selectors,
    aggregations and legends name; the variable keeps its name, `$cluster`."""
    values = {**VALUES["all-on"], "prometheusRule": {"clusterLabel": "kube_cluster"}}
    text = only(render(values), "ConfigMap")["data"]["procdelta.json"]
    model = json.loads(text)
    (variable,) = [v for v in model["templating"]["list"] if v["name"] == "cluster"]
    assert variable["definition"] == "label_values(procdelta_build_info, kube_cluster)"
    queries = [t["expr"] for p in model["panels"] for t in p.get("targets", [])]
    assert all('kube_cluster=~"$cluster"' in q for q in queries if "$cluster" in q)
    assert any("by (kube_cluster, node, namespace, pod)" in q for q in queries)
    assert not re.search(r'(?<![$\w"_])cluster(?![\w])', text.replace('"cluster"', ""))
    legends = [t["legendFormat"] for p in model["panels"] for t in p.get("targets", [])]
    assert "{{kube_cluster}} {{namespace}}/{{pod}}" in legends


# -- the rules -----------------------------------------------------------------------------

RULE_TESTS = ROOT / "deploy" / "prometheus" / "procdelta.rules.test.yml"
WORKLOAD_RULE_TESTS = RULE_TESTS.with_name("procdelta.workload.rules.test.yml")
CAUSES_RULE_TESTS = RULE_TESTS.with_name("procdelta.causes.rules.test.yml")
PAGES_RULE_TESTS = RULE_TESTS.with_name("procdelta.pages.rules.test.yml")


def rule_file(values: dict, path: Path) -> Path:
    """The PrometheusRule's groups with these values, installed as the kustomize base and the
    plain rule file are (namespace and release `procdelta`: the pod alerts' command names
    them), for promtool."""
    rule = only(
        render({"prometheusRule": {"enabled": True, **values}}, namespace=generate.NAMESPACE),
        "PrometheusRule",
    )
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True)


def test_prometheus_rule_passes_the_rule_tests(tmp_path):
    """The chart's groups with default values, through `promtool check` and every case of
    deploy/prometheus/procdelta{,.workload,.causes,.pages}.rules.test.yml."""
    rules = rule_file({}, tmp_path / "procdelta.rules.yml")
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    for tests in (RULE_TESTS, WORKLOAD_RULE_TESTS, CAUSES_RULE_TESTS, PAGES_RULE_TESTS):
        (tmp_path / tests.name).write_text(tests.read_text())
        result = promtool("test", "rules", str(tmp_path / tests.name))
        assert result.returncode == 0, result.stdout + result.stderr


def rule_cases() -> dict[str, dict]:
    return {c["name"]: c for c in yaml.safe_load(RULE_TESTS.read_text())["tests"]}


def moved(text: str, old: str, new: str) -> str:
    """The text with a threshold's words replaced; they must be there."""
    assert old in text, (old, text)
    return text.replace(old, new)


def test_alert_thresholds_are_values(tmp_path):
    """Thresholds, durations and severities set through values change when the alerts fire:
    the fixtures' starved pod (its neighbours' share 0.5 from the first minute) fires sooner
    and louder under a lower threshold, not at all under a higher one, nor the throttled pod
    (its quota's share 0.9, every period throttled) under higher shares; the stalled node
    (last pass 10 minutes ago, 15 s intervals) and the down target (job procdelta) raise
    nothing under a longer stall and another job."""
    values = {
        "job": "procdelta-nodes",
        "alerts": {
            "podCPUStarved": {"neighboursShare": 0.4, "for": "5m", "severity": "critical"},
            "passesStalled": {"intervals": 50},
        },
    }
    rules = rule_file(values, tmp_path / "moved.rules.yml")
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    cases = rule_cases()
    starved = cases["recording rules, per pod and per namespace"]
    starved.pop("promql_expr_test")
    (firing,) = [t for t in starved["alert_rule_test"] if t["exp_alerts"]]
    (alert,) = firing["exp_alerts"]
    alert["exp_labels"]["severity"] = "critical"
    annotations = alert["exp_annotations"]
    annotations["description"] = moved(
        annotations["description"], "(threshold 25%, for 15m;", "(threshold 40%, for 5m;"
    )
    # fires after 5 minutes instead of 15, with the severity and threshold given
    starved["alert_rule_test"] = [{**firing, "eval_time": "10m"}]
    health = cases["collector health alerts"]
    health["alert_rule_test"] = [
        # stalled for 10 minutes is under the 50 intervals of 15 s set
        {"alertname": "ProcdeltaPassesStalled", "eval_time": "10m", "exp_alerts": []},
        # up{job="procdelta"} is no longer the job the alerts watch
        {"alertname": "ProcdeltaTargetDown", "eval_time": "10m", "exp_alerts": []},
    ]
    result = run_cases(tmp_path, rules, [starved, health])
    assert result.returncode == 0, result.stdout + result.stderr
    # the same cases fail against the default values: the values made the difference
    default = rule_file({}, tmp_path / "default.rules.yml")
    cases = [starved] + [{**health, "alert_rule_test": [t]} for t in health["alert_rule_test"]]
    for case in cases:
        assert run_cases(tmp_path, default, [case]).returncode != 0, case["alert_rule_test"]

    # thresholds above the pods' shares: neither the starved nor the throttled pod fires
    above = rule_file(
        {
            "alerts": {
                "podCPUStarved": {"neighboursShare": 0.6},
                "podCPUThrottled": {"waitShare": 0.95, "throttledShare": 1},
            }
        },
        tmp_path / "above.rules.yml",
    )
    causes = rule_cases()[
        "throttled by its own limit, contended by others, short-lived, under pressure"
    ]
    causes.pop("promql_expr_test")
    for test in causes["alert_rule_test"]:
        assert test["alertname"] == "ProcdeltaPodCPUOwnThreads" or test["exp_alerts"]
        test["exp_alerts"] = []
    result = run_cases(tmp_path, above, [causes])
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_cases(tmp_path, default, [causes]).returncode != 0


def test_each_busy_finding_keeps_its_own_cpu_floor(tmp_path):
    """The starved and own-threads findings share one selection of the pods' CPU while
    their floors (minCores) are the same; set apart, each pod is held to its own finding's:
    under a 1.2-core floor for own threads alone, the kernel case's pinned pod (1 core) and
    light one (0.2) lose their own-threads finding, the hog (1.52) keeps it, and the
    starved pods (0.18 to 0.3 core) keep theirs."""
    case = {c["name"]: c for c in yaml.safe_load(CAUSES_RULE_TESTS.read_text())["tests"]}[
        "the kernel's moment-by-moment basis (cgroup CPU pressure)"
    ]
    case.pop("alert_rule_test", None)
    findings = "count by (finding) (node_namespace_pod:procdelta_cpu_finding:ratio_rate5m)"
    by_default = {"starved": 3, "own_threads": 3, "throttled": 1}
    apart = {"starved": 3, "own_threads": 1, "throttled": 1}

    def expect(counts: dict[str, int]) -> dict:
        samples = [{"labels": f'{{finding="{f}"}}', "value": n} for f, n in counts.items()]
        return {"expr": findings, "eval_time": "20m", "exp_samples": samples}

    default = rule_file({}, tmp_path / "default.rules.yml")
    own_floor = rule_file(
        {"alerts": {"podCPUOwnThreads": {"minCores": 1.2}}}, tmp_path / "own-floor.rules.yml"
    )
    for rules, counts in ((default, by_default), (own_floor, apart)):
        result = run_cases(tmp_path, rules, [{**case, "promql_expr_test": [expect(counts)]}])
        assert result.returncode == 0, result.stdout + result.stderr
    moved = run_cases(tmp_path, own_floor, [{**case, "promql_expr_test": [expect(by_default)]}])
    assert moved.returncode != 0


# -- one source of truth -------------------------------------------------------------------


def test_derived_files_are_the_charts_rendering():
    """deploy/*.yaml (the kustomize base), the plain rule file, Chart.yaml's version, the
    chart's dashboard copy and its README's table of values are what deploy/generate.py
    writes now."""
    assert generate.stale() == [], "run `python deploy/generate.py` and commit"


def test_kustomize_base_is_the_chart_without_helms_labels():
    base = yaml.safe_load((ROOT / "deploy" / "daemonset.yaml").read_text())
    rendered = only(render(generate.base_values(), namespace="procdelta"), "DaemonSet")
    for labels in (
        rendered["metadata"]["labels"],
        rendered["spec"]["template"]["metadata"]["labels"],
    ):
        del labels["helm.sh/chart"], labels["app.kubernetes.io/managed-by"]
    assert base == rendered


def test_chart_version_is_the_projects():
    with helm_python.Chart.load(CHART) as chart:
        assert chart.version == chart.metadata["appVersion"] == generate.version()


def test_every_value_is_documented():
    text = (CHART / "values.yaml").read_text()
    assert generate.undocumented(text) == []
    readme = (CHART / "README.md").read_text()
    for key, _ in generate.documented_values(text):
        assert f"| `{key}` |" in readme


def workload_cases() -> dict[str, dict]:
    return {c["name"]: c for c in yaml.safe_load(WORKLOAD_RULE_TESTS.read_text())["tests"]}


def run_cases(tmp_path: Path, rules: Path, cases: list[dict]) -> subprocess.CompletedProcess:
    tests = tmp_path / f"{rules.stem}.test.yml"
    tests.write_text(
        yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": cases})
    )
    return promtool("test", "rules", str(tests))


def alerts_of(rules: Path) -> set[str]:
    groups = yaml.safe_load(rules.read_text())["groups"]
    return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}


POD_ALERTS = {"podCPUStarved", "podCPUThrottled", "podCPUOwnThreads"}
WORKLOAD_ALERTS = {"workloadCPUStarved", "workloadCPUThrottled"}


def alert_name(value: str) -> str:
    return "Procdelta" + value[0].upper() + value[1:]


def test_pod_and_workload_alerts_turn_off_independently(tmp_path):
    """Either kind of alert can be turned off; with the pod alerts off, their thresholds
    still say which pods count as starved or throttled for the workload rules and alerts."""
    pods_off = rule_file(
        {"alerts": {name: {"enabled": False} for name in POD_ALERTS}},
        tmp_path / "pods-off.rules.yml",
    )
    workloads_off = rule_file(
        {"alerts": {name: {"enabled": False} for name in WORKLOAD_ALERTS}},
        tmp_path / "workloads-off.rules.yml",
    )
    pod_alerts = {alert_name(name) for name in POD_ALERTS}
    workload_alerts = {alert_name(name) for name in WORKLOAD_ALERTS}
    every = pod_alerts | workload_alerts
    assert every <= alerts_of(rule_file({}, tmp_path / "default.rules.yml"))
    assert every - alerts_of(pods_off) == pod_alerts
    assert every - alerts_of(workloads_off) == workload_alerts
    case = workload_cases()["workloads from kube-state-metrics, without kubernetes-mixin's map"]
    pods = [t for t in case["alert_rule_test"] if t["alertname"] in pod_alerts]
    workloads = [t for t in case["alert_rule_test"] if t["alertname"] in workload_alerts]
    # each kind fires in this case, so that turning it off shows
    assert {t["alertname"] for t in pods if t["exp_alerts"]} == pod_alerts - {
        "ProcdeltaPodCPUOwnThreads"
    }
    assert {t["alertname"] for t in workloads if t["exp_alerts"]} == workload_alerts
    # pod alerts off: the workload alerts and every recording rule as with the defaults
    result = run_cases(tmp_path, pods_off, [{**case, "alert_rule_test": workloads}])
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_cases(tmp_path, workloads_off, [{**case, "alert_rule_test": pods}])
    assert result.returncode == 0, result.stdout + result.stderr
    # and an alert turned off no longer fires
    for rules, tests in ((pods_off, pods), (workloads_off, workloads)):
        silent = [{**test, "exp_alerts": []} for test in tests]
        result = run_cases(tmp_path, rules, [{**case, "alert_rule_test": silent}])
        assert result.returncode == 0, result.stdout + result.stderr


def test_workload_thresholds_are_values(tmp_path):
    """A higher share of pods spares the fixtures' DaemonSet (one starved pod of four, 25%),
    which the default (more than a fifth of its pods) raises; the Deployment (two of three)
    fires, after the `for` and with the severity given."""
    rules = rule_file(
        {"alerts": {"workloadCPUStarved": {"podShare": 0.5, "for": "5m", "severity": "page"}}},
        tmp_path / "moved.rules.yml",
    )
    case = workload_cases()["workloads from kube-state-metrics, without kubernetes-mixin's map"]
    (starved,) = [
        t for t in case["alert_rule_test"] if t["alertname"] == "ProcdeltaWorkloadCPUStarved"
    ]
    by_workload = {alert["exp_labels"]["workload"]: alert for alert in starved["exp_alerts"]}
    assert set(by_workload) == {"agent", "web"}  # the defaults raise both
    web = by_workload["web"]
    web["exp_labels"]["severity"] = "page"
    web["exp_annotations"]["description"] = moved(
        web["exp_annotations"]["description"],
        "threshold above 20% of its pods or 5 of them, for 15m",
        "threshold above 50% of its pods or 5 of them, for 5m",
    )
    # web alone, already at 10 minutes, and still alone at 20
    tests = [
        {"alertname": starved["alertname"], "eval_time": eval_time, "exp_alerts": [web]}
        for eval_time in ("10m", "20m")
    ]
    moved_case = {**case, "promql_expr_test": [], "alert_rule_test": tests}
    result = run_cases(tmp_path, rules, [moved_case])
    assert result.returncode == 0, result.stdout + result.stderr
    # the defaults raise agent too, and nobody by 10 minutes
    result = run_cases(tmp_path, rule_file({}, tmp_path / "default.rules.yml"), [moved_case])
    assert result.returncode != 0


@pytest.mark.parametrize(("value", "interval"), [(None, "1m"), ("5m", "5m"), ("", None)])
def test_the_workload_rules_are_evaluated_on_an_interval_of_their_own(value, interval):
    """The pod -> workload map, the costliest rule and one that changes only as pods come
    and go, and the workload ratios that read it, have a group of their own evaluated
    every prometheusRule.workloadInterval (empty: the Prometheus' interval, as every other
    group here); the map first, so that the ratios read the map of the same evaluation."""
    values = {"prometheusRule": {"enabled": True, "podInterval": ""}}
    if value is not None:
        values["prometheusRule"]["workloadInterval"] = value
    groups = only(render(values), "PrometheusRule")["spec"]["groups"]
    (group,) = [g for g in groups if g["name"] == "procdelta.workload.rules"]
    assert [r["record"] for r in group["rules"]] == [
        "namespace_workload_pod:procdelta_pod_owner:relabel",
        "namespace_workload:procdelta_pods_cpu_starved:ratio",
        "namespace_workload:procdelta_pods_cpu_throttled:ratio",
        "namespace_workload:procdelta_pods_cpu_starved:count",
    ]
    assert group.get("interval") == interval
    assert [g["name"] for g in groups if "interval" in g] == (
        ["procdelta.workload.rules"] if interval else []
    )
    with pytest.raises(Exception, match="workloadInterval"):
        render({"prometheusRule": {"enabled": True, "workloadInterval": "a minute"}})


FINDING_ALERT_VALUES = (
    "nodeCPUSaturated",
    "workloadStarvingNodes",
    "workloadCPUStarved",
    "workloadCPUStarvedOften",
    "podCPUStarved",
    "podCPUThrottled",
    "podCPUOwnThreads",
    "workloadCPUThrottled",
    "nodeCPUPressureMissing",
)
POD_FINDING_ALERTS = {
    "ProcdeltaNodeCPUSaturated",
    "ProcdeltaWorkloadStarvingNodes",
    "ProcdeltaWorkloadCPUStarved",
    "ProcdeltaWorkloadCPUStarvedOften",
    "ProcdeltaPodCPUStarved",
    "ProcdeltaPodCPUThrottled",
    "ProcdeltaPodCPUOwnThreads",
    "ProcdeltaWorkloadCPUThrottled",
    "ProcdeltaNodeCPUPressureMissing",
}


@pytest.mark.parametrize(("value", "interval"), [(None, "1m"), ("2m", "2m"), ("", None)])
def test_the_pod_rules_and_their_alerts_are_evaluated_on_an_interval_of_their_own(value, interval):
    """The per-pod records (5-minute rates) and the alerts on the findings (15 minutes) are
    evaluated every prometheusRule.podInterval (empty: the Prometheus' interval); the
    alerts on procdelta itself, a stalled pass among them, keep the Prometheus' interval."""
    values = {"prometheusRule": {"enabled": True, "workloadInterval": ""}}
    if value is not None:
        values["prometheusRule"]["podInterval"] = value
    groups = {g["name"]: g for g in only(render(values), "PrometheusRule")["spec"]["groups"]}
    assert {name: g.get("interval") for name, g in groups.items()} == {
        "procdelta.pod.rules": interval,
        "procdelta.workload.rules": None,
        "procdelta.node.rules": None,
        "procdelta.alerts": interval,
        "procdelta.collector.alerts": None,
    }
    alerts = {name: {r["alert"] for r in g["rules"] if "alert" in r} for name, g in groups.items()}
    assert alerts["procdelta.alerts"] == POD_FINDING_ALERTS
    assert "ProcdeltaPassesStalled" in alerts["procdelta.collector.alerts"]
    assert not alerts["procdelta.collector.alerts"] & POD_FINDING_ALERTS
    with pytest.raises(Exception, match="podInterval"):
        render({"prometheusRule": {"enabled": True, "podInterval": "a minute"}})
    # every alert on the findings off: no group without rules (the CRD wants a list)
    off = {alert: {"enabled": False} for alert in FINDING_ALERT_VALUES}
    rule = only(render({"prometheusRule": {"enabled": True, "alerts": off}}), "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == [
        "procdelta.pod.rules",
        "procdelta.workload.rules",
        "procdelta.node.rules",
        "procdelta.collector.alerts",
    ]


def test_pod_alerts_fire_without_the_workload_map(tmp_path):
    """The pod alerts join their pod's workload labels from the workload map; a pod the map
    lacks (its group failed, or has not run yet) still raises its alert."""
    rules = rule_file({}, tmp_path / "nomap.rules.yml")
    spec = yaml.safe_load(rules.read_text())
    names = {g["name"] for g in spec["groups"]}
    assert "procdelta.workload.rules" in names
    spec["groups"] = [g for g in spec["groups"] if g["name"] != "procdelta.workload.rules"]
    rules.write_text(yaml.safe_dump(spec))
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = set()
    for case in cases:
        case.pop("promql_expr_test", None)
        for test in case.get("alert_rule_test", []):
            for alert in test["exp_alerts"]:
                alert["exp_labels"].pop("workload", None)
                alert["exp_labels"].pop("workload_type", None)
                fired.add(test["alertname"])
    assert {"ProcdeltaPodCPUStarved", "ProcdeltaPodCPUThrottled"} <= fired
    result = run_cases(tmp_path, rules, cases)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "through_processes"),
    [
        ({}, True),
        ({"processes": {"enabled": False}}, False),
        ({"procdelta": {"webConfig": {"secretName": "procdelta-web"}}}, False),
    ],
)
def test_the_pod_alerts_name_the_command_that_runs_top_on_their_pod(values, through_processes):
    """The starved and throttled pod alerts end with the one command of docs/findings.md:
    procdelta's pod on the alert's node, found by the DaemonSet's namespace and selector,
    runs `procdelta top` on the alert's pod; through its /processes where that is served
    without a web configuration, else on top's own passes."""
    objects = render({"prometheusRule": {"enabled": True}, "service": {"port": 9800}, **values})
    daemonset = only(objects, "DaemonSet")
    namespace = daemonset["metadata"]["namespace"]
    rules = [r for g in only(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    for name in ("ProcdeltaPodCPUStarved", "ProcdeltaPodCPUThrottled"):
        (rule,) = [r for r in rules if r.get("alert") == name]
        description = rule["annotations"]["description"]
        # Prometheus fills in the alert's labels: here, the findings page's placeholders
        for label, placeholder in (("node", "NODE"), ("namespace", "NAMESPACE"), ("pod", "POD")):
            description = description.replace(f"{{{{ $labels.{label} }}}}", placeholder)
        outer = shlex.split(description[description.index("kubectl ") :])
        (target,) = [word for word in outer if word.startswith("$(")]
        inner = shlex.split(target.removeprefix("$(").removesuffix(")"))
        assert outer[:4] == ["kubectl", "-n", namespace, "exec"]
        assert inner[:5] == ["kubectl", "-n", namespace, "get", "pod"]
        selector = dict(label.split("=") for label in inner[inner.index("-l") + 1].split(","))
        assert selector == daemonset["spec"]["selector"]["matchLabels"]
        assert inner[inner.index("--field-selector") + 1] == "spec.nodeName=NODE"
        command = outer[outer.index("--") + 1 :]
        expected = ["procdelta", "top", "--pod", "NAMESPACE/POD"]
        if through_processes:
            expected[2:2] = ["--from", "http://127.0.0.1:9800"]
        assert command == expected


def test_the_alertmanager_config_inhibits_as_the_findings_page_says():
    """The optional AlertmanagerConfig: the inhibit rules of docs/findings.md, on the
    cluster label the rules keep (a value), and nothing rendered unless asked for."""
    text = (ROOT / "docs" / "findings.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b]
    documented = [
        (r["source_matchers"], r["target_matchers"], r["equal"])
        for r in yaml.safe_load(block)["inhibit_rules"]
    ]
    assert "AlertmanagerConfig" not in render({})
    for label in ("cluster", "k8s_cluster"):
        config = only(
            render(
                {"alertmanagerConfig": {"enabled": True}, "prometheusRule": {"clusterLabel": label}}
            ),
            "AlertmanagerConfig",
        )
        assert config["apiVersion"] == "monitoring.coreos.com/v1alpha1"
        rendered = [
            (
                [f'{m["name"]} {m["matchType"]} "{m["value"]}"' for m in r["sourceMatch"]],
                [f'{m["name"]} {m["matchType"]} "{m["value"]}"' for m in r["targetMatch"]],
                r["equal"],
            )
            for r in config["spec"]["inhibitRules"]
        ]
        expected = [(s, t, [label if e == "cluster" else e for e in eq]) for s, t, eq in documented]
        assert rendered == expected

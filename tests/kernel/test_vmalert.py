"""The shipped rules under vmalert over VictoriaMetrics (Debian's `victoria-metrics`), beside
Prometheus, on the same live pods: vmagent scrapes the same `procdelta serve` as Prometheus
does, vmalert evaluates deploy/prometheus/procdelta.vmalert.rules.yml (the rule file without
`keep_firing_for`, which vmalert 1.79 refuses) in MetricsQL, whose `rate()` does not
extrapolate, and the same alerts rise under both engines.

Needs root, the v1 `cpu` controller beside the v2 tree, Debian's `prometheus` and
`victoria-metrics`; a missing one fails the test, it does not skip.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.kernel.test_end_to_end import Prometheus, shortened
from tests.kernel.test_findings_kernel import NODE, Container, Pod, running, serving, two_cpus
from tests.net import http_get, wait_until
from tests.promtools import binary
from tests.victoria import victoria

pytestmark = [pytest.mark.kernel, pytest.mark.cpu_shares]
VMALERT_RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "procdelta.vmalert.rules.yml"
EXPECTED = {
    ("ProcdeltaPodCPUStarved", "victim"),
    ("ProcdeltaWorkloadCPUStarved", "victim"),
    ("ProcdeltaNodeCPUSaturated", NODE),
    ("ProcdeltaPodCPUOwnThreads", "hog"),
    ("ProcdeltaPodCPUThrottled", "at-quota"),
    ("ProcdeltaWorkloadCPUThrottled", "at-quota"),
}
"""The alerts the pods below raise: a pinned victim of a hog (its node pages: no
kube-state-metrics, so its QoS class alone says it is owed), the hog behind its own three
threads, a pod at its quota on the other CPU. Not the victim's burst ticket: its share is of
a whole hour, and its own ticket is the same incident."""


def test_vmalert_takes_the_rule_file_it_is_given():
    result = subprocess.run(
        [binary("vmalert", "victoria-metrics"), f"-rule={VMALERT_RULES}", "-dryRun"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "keep_firing_for:" not in VMALERT_RULES.read_text()


def found(pairs) -> set[tuple[str, str]]:
    """(alert, pod or node) of the e2e pods' and the test node's alerts."""
    return {
        (name, labels.get("workload") or labels.get("pod") or labels.get("node"))
        for name, labels in pairs
        if labels.get("namespace") == "e2e"
        or (name == "ProcdeltaNodeCPUSaturated" and labels.get("node") == NODE)
    }


def test_the_same_alerts_rise_under_vmalert_as_under_prometheus(tmp_path):
    two_cpus()
    pods = [
        Pod("victim", 200, [Container(("--busy", "1", "--busy-cpus", "0"))]),
        Pod("hog", 1000, [Container(("--busy", "3", "--busy-cpus", "0,0,0"))]),
        Pod("at-quota", 200, [Container(("--busy", "1", "--busy-cpus", "1"), 200)]),
    ]
    logs = tmp_path / "logs"
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "vm").mkdir()
    rules = tmp_path / "vm" / "procdelta.rules.yml"
    rules.write_text(shortened(VMALERT_RULES.read_text()))
    with running(pods, logs), serving(logs) as target:
        prometheus = Prometheus(tmp_path / "prometheus", [target], labels={"node": NODE})
        try:
            with victoria(tmp_path / "vm", [target], rules, {"node": NODE}) as vm:

                def under_prometheus() -> set[tuple[str, str]]:
                    answer = json.loads(http_get(f"{prometheus.url}/api/v1/alerts"))
                    return found(
                        (a["labels"]["alertname"], a["labels"]) for a in answer["data"]["alerts"]
                    )

                def under_vmalert() -> set[tuple[str, str]]:
                    return found(
                        (a.get("name") or a["labels"].get("alertname"), a["labels"])
                        for a in vm.alerts()
                    )

                wait_until(lambda: under_prometheus() == EXPECTED, 120, "Prometheus' alerts")
                wait_until(lambda: under_vmalert() == EXPECTED, 120, "vmalert's alerts")
                assert under_prometheus() == under_vmalert() == EXPECTED
                # vmalert's records, in VictoriaMetrics: the victim's neighbours' share
                shares = vm.query(
                    'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{cause="neighbours",'
                    'namespace="e2e",pod="victim"}'
                )
                assert len(shares) == 1 and float(shares[0]["value"][1]) > 0.5
        finally:
            prometheus.stop()

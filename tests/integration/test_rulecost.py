"""tests/tools/rulecost.py's synthetic fleet and its count of raw selections: the pages it serves
Prometheus are the collector's families (docs/reference.md §5, §7), lint-clean, and their
counters grow; the measuring itself (minutes of a real Prometheus) is not run here."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests import spec
from tests.net import http_get
from tests.promtools import check_metrics
from tests.tools.rulecost import (
    WAIT_CAUSES,
    FleetServer,
    kube_state_metrics_families,
    make_fleet,
    node_families,
    raw_selections,
    render,
    scrape_config,
)

RULES = """
groups:
  - name: a
    rules:
      - record: node_namespace_pod:procdelta_on_cpu_nanos:rate5m
        expr: sum by (cluster, node, namespace, pod) (rate(procdelta_on_cpu_nanos_total{pod!=""}[5m]))
      - record: x:y:ratio
        expr: |
          sum(rate(
            procdelta_run_delay_nanos_total[5m]))
          / sum(irate(procdelta_on_cpu_nanos_total[1m]))
          / sum(rate(node_namespace_pod:procdelta_on_cpu_nanos:rate5m[5m]))
  - name: b
    rules:
      - alert: A
        expr: increase(procdelta_passes_total[15m]) > 0 and present_over_time(procdelta_build_info[5m])
      - alert: B
        expr: procdelta_node_cpus > 0
"""  # noqa: E501


def test_raw_selections_counts_rate_over_raw_series_only():
    assert raw_selections(RULES) == {"a": (2, 3), "b": (0, 2)}


def samples(page: bytes) -> list[tuple[str, str, float]]:
    found = []
    for line in page.decode().splitlines():
        if not line.startswith("#"):
            match = re.fullmatch(r"(\w+)(\{.*\})? (\S+)", line)
            assert match, line
            found.append((match[1], match[2] or "", float(match[3])))
    return found


def test_a_node_page_is_the_collectors_families_and_lints_clean():
    fleet = make_fleet(nodes=2, pods=40)
    page = render(node_families(fleet, 1), fleet.epoch, fleet.epoch + 60)
    lint = check_metrics(page)
    assert lint.returncode == 0 and not lint.stdout, lint.stdout + lint.stderr
    rows = samples(page)
    pods = {labels for name, labels, _ in rows if name == "procdelta_footprint_processes"}
    assert len(pods) == 40 + 7  # its pods, and the processes outside pods
    pod_groups = {g for g in pods if g.startswith('{namespace="')}
    assert len(pod_groups) == 40
    assert all(re.fullmatch(r'\{namespace="[^"]+",pod="[^"]+",uid="[^"]+",qos="\w+"\}', g)
               for g in pod_groups)  # fmt: skip
    per_family = Counter(name for name, labels, _ in rows if labels in pod_groups)
    bandwidth = {"cpu_periods", "cpu_throttled_periods", "cpu_throttled_nanos"}
    interval_basis = {f for f in spec.CGROUP_FIELDS if f.startswith("run_delay_")}
    for field in [*spec.FIELDS, *(set(spec.CGROUP_FIELDS) - interval_basis), *WAIT_CAUSES]:
        expected = range(1, 40) if field in bandwidth else [40]  # some pods have quotas
        assert per_family[f"procdelta_interval_{field}"] in expected, field
        if field != "processes":
            assert per_family[f"procdelta_{field}_total"] in expected, field
    throttled = [v for name, _, v in rows if name == "procdelta_interval_cpu_throttled_periods"]
    assert max(throttled) > 0
    assert ("procdelta_node_cpus", "", 16) in rows


def test_the_page_has_every_family_of_the_collectors_own_page():
    fleet = make_fleet(nodes=1, pods=10)
    page = render(node_families(fleet, 0), fleet.epoch, fleet.epoch).decode()
    golden = (Path(__file__).parents[1] / "golden" / "metrics.prom").read_text()
    families = re.compile(r"^# TYPE (\S+) (\w+)$", re.M)
    # the fleet's nodes have cgroup PSI: why a group waited is on the kernel's basis there,
    # never the interval's split of its run delay (the fixture has groups on both)
    split = re.compile(r"_run_delay_(throttled|own_threads|neighbours|runnable)_")
    interval_basis = {f for f in families.findall(golden) if split.search(f[0])}
    assert len(interval_basis) == 8  # three causes and their whole, a gauge and a counter each
    assert interval_basis and set(families.findall(golden)) - interval_basis <= set(
        families.findall(page)
    )


def test_counters_grow_between_scrapes_and_gauges_hold():
    fleet = make_fleet(nodes=1, pods=20)
    families = node_families(fleet, 0)
    before = samples(render(families, fleet.epoch, fleet.epoch + 10))
    after = samples(render(families, fleet.epoch, fleet.epoch + 25))
    grew = Counter()
    for (name, labels, old), (name2, labels2, new) in zip(before, after, strict=True):
        assert (name, labels) == (name2, labels2)
        if name.startswith("procdelta_interval_") or name.startswith("procdelta_footprint_"):
            assert new == old, name
        else:
            assert new >= old, name
            grew[name] += new > old
    assert grew["procdelta_on_cpu_nanos_total"] == 20 + 7
    assert grew["procdelta_passes_total"] == 1


def test_kube_state_metrics_owns_every_pod():
    fleet = make_fleet(nodes=3, pods=30)
    page = render(kube_state_metrics_families(fleet), fleet.epoch, fleet.epoch)
    assert check_metrics(page).returncode == 0
    rows = samples(page)
    owners = [labels for name, labels, _ in rows if name == "kube_pod_owner"]
    assert len(owners) == len(fleet.pods) == 90
    kinds = Counter(re.search(r'owner_kind="(\w*)"', labels)[1] for labels in owners)
    assert kinds["DaemonSet"] == 3 * 3 and kinds["ReplicaSet"] > 0
    replicasets = {re.search(r'replicaset="([^"]+)"', labels)[1]
                   for name, labels, _ in rows if name == "kube_replicaset_owner"}  # fmt: skip
    owned = {re.search(r'owner_name="([^"]+)"', labels)[1]
             for labels in owners if 'owner_kind="ReplicaSet"' in labels}  # fmt: skip
    assert owned == replicasets


def test_one_server_serves_every_target_by_its_path():
    fleet = make_fleet(nodes=2, pods=10)
    server = FleetServer(fleet)
    try:
        jobs = scrape_config(fleet, server.port)
        targets = [t for job in jobs for t in job["static_configs"]]
        assert [t["targets"] for t in targets] == [[f"127.0.0.1:{server.port}"]] * 3
        assert {t["labels"]["cluster"] for t in targets} == {"synthetic"}
        assert [t["labels"].get("node") for t in targets] == ["node-000", "node-001", None]
        pages = {
            t["labels"]["node"]: http_get(
                f"http://127.0.0.1:{server.port}{t['labels']['__metrics_path__']}"
            )
            for t in targets[:2]
        }
        assert pages["node-000"] != pages["node-001"]
        ksm = http_get(f"http://127.0.0.1:{server.port}/kube-state-metrics/metrics")
        assert ksm.count(b"\nkube_pod_owner{") == 20
    finally:
        server.close()

"""The /metrics page: the fixture tree's page compared whole, linted, parsed in both formats.

Rewrite the golden page after an intended change with
`python -m pytest tests/integration/test_exposition.py --update-golden`, and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from collector.cli import run_once
from collector.exposition import Family, Histogram, Shapes
from collector.model import COUNTER_FIELD_NAMES, FIELD_NAMES
from collector.passloop import PassLoop
from tests.fixturetree import FixtureRun
from tests.pageoracle import render_openmetrics, render_text
from tests.promtools import check_metrics
from tests.spec import CGROUP_FIELDS, FIELDS
from tests.unit.test_golden import check_golden


def fixture_page() -> PassLoop:
    run = FixtureRun()
    loop = PassLoop(run.engine, interval=10.0, monotonic=lambda: 5.0, version="golden")
    run_once(run.engine, 10.0, run.sleep, run_pass=loop.run_pass)
    return loop


def test_metrics_page_golden(update_golden):
    check_golden("metrics.prom", fixture_page().snapshot().text.decode(), update_golden)


def test_metrics_page_passes_promtool():
    result = check_metrics(fixture_page().snapshot().text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == b"" and result.stderr == b""


def test_every_family_of_the_spec_with_its_type():
    families = {f.name: f for f in parse_text(fixture_page().snapshot().text.decode())}
    expected = {f"procdelta_interval_{name}": "gauge" for name in FIELD_NAMES}
    expected |= {f"procdelta_{name}": "counter" for name in COUNTER_FIELD_NAMES}
    expected |= {
        "procdelta_footprint_processes": "gauge",
        "procdelta_footprint_threads": "gauge",
        "procdelta_footprint_rss_bytes": "gauge",
        "procdelta_interval_seconds": "gauge",
        "procdelta_last_pass_timestamp_seconds": "gauge",
        "procdelta_pass_duration_seconds": "histogram",
        "procdelta_passes": "counter",
        "procdelta_dropped_deltas": "counter",
        "procdelta_dropped_thread_deltas": "counter",
        "procdelta_tracked_processes": "gauge",
        "procdelta_tracked_threads": "gauge",
        "procdelta_build_info": "gauge",
        "procdelta_dropped_cgroup_deltas": "counter",
        "procdelta_tracked_cgroups": "gauge",
        "procdelta_skipped_processes": "gauge",
    }
    expected |= {f"procdelta_interval_{name}": "gauge" for name in CGROUP_FIELDS}
    expected |= {f"procdelta_{name}": "counter" for name in CGROUP_FIELDS}
    for name, kind in expected.items():
        assert name in families, name
        assert families[name].type == kind, name
    reasons = {s.labels["reason"] for s in families["procdelta_dropped_deltas"].samples}
    assert reasons >= {"first_seen", "pid_reused", "counter_fell", "unreadable"}
    thread_reasons = {
        s.labels["reason"]: s.value for s in families["procdelta_dropped_thread_deltas"].samples
    }
    assert thread_reasons == {"first_seen": 0, "pid_reused": 0, "counter_fell": 1}
    # the fixture's pass 2: every pod and cgroup group with a delta has interval series
    pods = {s.labels.get("pod") for s in families["procdelta_interval_processes"].samples}
    assert {"cart-7d9f", "nginx-0", "etcd-node1", ""} <= pods


def test_openmetrics_page_parses_strictly():
    snapshot = fixture_page().snapshot()
    families = {f.name: f for f in parse_om((snapshot.openmetrics + b"# EOF\n").decode())}
    assert families["procdelta_passes"].samples[0].value == 2
    text = {f.name: f for f in parse_text(snapshot.text.decode())}
    assert set(families) == set(text)


def test_values_are_exact_integers_past_float_precision():
    big = 2**63 + 1
    family = Family("procdelta_on_cpu_nanos", "counter", "x", (("_total", (("pod", "p"),), big),))
    assert f'procdelta_on_cpu_nanos_total{{pod="p"}} {big}\n'.encode() in render_text([family])
    assert f"{big}".encode() in render_openmetrics([family])


def test_label_values_are_escaped():
    family = Family(
        "x", "gauge", 'help "with" \\ and\nnewline', (("", (("cgroup", 'a"b\\c\nd'),), 1),)
    )
    page = render_text([family])
    assert b'x{cgroup="a\\"b\\\\c\\nd"} 1\n' in page
    (parsed,) = parse_text(page.decode())
    assert parsed.samples[0].labels["cgroup"] == 'a"b\\c\nd'
    (parsed_om,) = parse_om(render_openmetrics([family]).decode())
    assert parsed_om.samples[0].labels["cgroup"] == 'a"b\\c\nd'


PER_GROUP = (
    {f"procdelta_interval_{name}" for name in FIELDS + CGROUP_FIELDS}
    | {f"procdelta_{name}" for name in FIELDS[1:] + CGROUP_FIELDS}
    | {f"procdelta_footprint_{name}" for name in ("processes", "threads", "rss_bytes")}
)


PERFORMANCE = Path(__file__).parents[2] / "docs" / "performance.md"
SWITCHES = {
    "default": (Shapes(), True),
    "`--no-export.interval-gauges`": (Shapes(interval_gauges=False), True),
    "`--no-export.totals`": (Shapes(totals=False), True),
    "`--no-collector.cgroup`": (Shapes(cgroup=False), True),
    # the split's three parts and their whole, both shapes
    "`--no-collector.cgroup.pressure`": (Shapes(), False),
    "`--no-export.interval-gauges --collector.cgroup.pressure.cpu-only` (the chart's fleet "
    "profile)": (Shapes(interval_gauges=False), "cpu"),
    "`--no-collector.cgroup --no-export.interval-gauges` (the leanest)": (
        Shapes(cgroup=False, interval_gauges=False),
        True,
    ),
}
"""Each row of docs/performance.md's "Series and bytes per pod" table: the switches it
names, as the page's shapes and the cgroup pressure read (all, none, the CPU's). The row of
`--per-container` (a pod of two containers, one of them without processes) is not one
group's families: not here."""


def series_table() -> list[tuple[str, int, int | None]]:
    """The table's rows: (switch, series a pod, series for 110 pods where given)."""
    text = PERFORMANCE.read_text()
    table = text[text.index("| switch | series/pod |") :].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("`--per-container`"):
            continue
        per_pod = int(cells[1].strip("*"))
        fleet = int(cells[3].replace(",", "")) if cells[3] else None
        rows.append((cells[0], per_pod, fleet))
    return rows


@pytest.mark.parametrize(("switch", "per_pod", "fleet"), series_table(), ids=lambda x: str(x))
def test_series_per_pod_for_each_switch_setting(switch, per_pod, fleet):
    """docs/performance.md's table, each row's numbers read from it: how many per-group
    families a setting fills, so at most that many series per pod (a pod with every source
    has one in each), but for why it waited, which a group has on one basis only
    (collector/waits.py): the fixture fills both. Every family is filled by some group of
    the fixture. The series for 110 pods are 110 times as many."""
    shapes, pressure = SWITCHES[switch]
    assert fleet is None or fleet == 110 * per_pod, switch
    run = FixtureRun(cgroups=shapes.cgroup)
    if run.engine.cgroupfs is not None:
        run.engine.cgroupfs.pressure = bool(pressure)
        run.engine.cgroupfs.cpu_pressure_only = pressure == "cpu"
    loop = PassLoop(run.engine, interval=10.0, monotonic=lambda: 5.0, shapes=shapes)
    run_once(run.engine, 10.0, run.sleep, run_pass=loop.run_pass)
    families = [f for f in parse_text(loop.snapshot().text.decode()) if f.name in PER_GROUP]
    filled = {family.name for family in families if family.samples}
    # with pressure, the fixture has groups on both bases: the other basis's three causes
    # and what they are parts of
    other_basis = 4 * (shapes.interval_gauges + shapes.totals) if pressure and shapes.cgroup else 0
    assert len(filled) == per_pod + other_basis, sorted(filled)


def test_page_values_derived_by_hand():
    """Series of the fixture's page against the fixture's own numbers (see
    tests/unit/test_golden.py's BY_HAND for the derivations), not against the golden page."""
    page = fixture_page().snapshot().text.decode()
    cart = (
        'namespace="shop",pod="cart-7d9f",uid="0b3e7a52-9c1d-4f6e-8a2b-5d4c3b2a1f00",'
        'qos="burstable"'
    )
    odd = 'cgroup="/system.slice/odd.service"'
    wanted = [
        # threads 200 +400 ms, 201 +390 ms, 203 born with 120 ms
        f"procdelta_interval_on_cpu_nanos{{{cart}}} 910000000",
        # pass 1 gave no delta (first sightings), so the counter is the one interval
        f"procdelta_on_cpu_nanos_total{{{cart}}} 910000000",
        f"procdelta_write_bytes_total{{{cart}}} 1048576",
        # PID 200 in pass 2, with threads 200, 201 and 203; 5000 pages of 4 KiB
        f"procdelta_footprint_processes{{{cart}}} 1",
        f"procdelta_footprint_threads{{{cart}}} 3",
        f"procdelta_footprint_rss_bytes{{{cart}}} 20480000",
        # cpuacct.usage +2.5 s; throttled in all 100 periods, 8 s (tests/cgroupfixture.py)
        f"procdelta_interval_cgroup_cpu_nanos{{{cart}}} 2500000000",
        f"procdelta_cpu_throttled_periods_total{{{cart}}} 100",
        # PIDs 100 (+2 ms) and 500 (born: 30 ms) contributed; 100, 400, 500 and 501 were
        # seen whole (800's stat is malformed), 200 + 100 + 100 + 100 pages
        f"procdelta_interval_processes{{{odd}}} 2",
        f"procdelta_on_cpu_nanos_total{{{odd}}} 32000000",
        f"procdelta_footprint_processes{{{odd}}} 4",
        f"procdelta_footprint_rss_bytes{{{odd}}} 2048000",
        # 501 reused; 1000's majflt fell; 400's io and 800's stat are malformed
        'procdelta_dropped_deltas_total{reason="pid_reused"} 1',
        'procdelta_dropped_deltas_total{reason="counter_fell"} 1',
        'procdelta_dropped_deltas_total{reason="unreadable"} 2',
        'procdelta_dropped_thread_deltas_total{reason="counter_fell"} 1',  # thread 1101
        "procdelta_passes_total 2",
    ]
    lines = set(page.splitlines())
    assert [line for line in wanted if line not in lines] == []


def test_a_histogram_observation_on_a_bound_counts_in_that_bucket():
    """`le` is "less than or equal": an observation equal to a bucket's bound is in it
    (and in every one above), as Prometheus' histograms count it."""
    histogram = Histogram.empty((0.1, 1.0)).observe(0.1).observe(1.0).observe(1.5)
    assert histogram.counts == (1, 2, 3) and histogram.count == 3
    assert histogram.total == 2.6


def test_the_series_table_has_a_row_for_each_switch_setting():
    """Every setting the test above knows is a row of the table, and every row one it
    knows: a row added to the docs is checked, or this fails."""
    assert [row[0] for row in series_table()] == list(SWITCHES)

"""A tenant's exit storm beside a pod of short processes, under `serve --collector.exits`, on a
node of 1,000 idle processes (the bench's table): the tenant, one unprivileged process
making thread exits as fast as it can (collector/storm.py as `nobody`), costs the pod
beside it none of its records, the scrapes and the passes little, against a serve without
the records beside it under the same storm. Needs root (cgroups, CAP_NET_ADMIN, setpriv);
fails without.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.bench.tables import pid_room, synthetic_table
from tests.cgroups import cgroup, enter
from tests.kernel.test_lineage_kernel import LIVES, tenant_and_victim
from tests.kernel.test_reliability import passes, scrape, value
from tests.net import free_port, start_serve, wait_until

pytestmark = pytest.mark.kernel

SECONDS = float(os.environ.get("PROCDELTA_STORM_SECONDS", "60")) / 2
ROOT = Path(__file__).resolve().parents[2]
TABLE = 1000  # idle processes beside, as a node has (the bench's default table)


def phase(port: int, seconds: float, beside: int) -> tuple[list[float], float, float, list]:
    """Scrape `port` and `beside` every 0.05 s for `seconds`: each scrape's latency, and the
    mean pass over the span (the pass histogram's sum over its count, as they grew), of
    the serve on `port`, of that on `beside`, under the same load; and the latencies of
    `beside`'s scrapes."""
    first = scrape(port), scrape(beside)
    latencies, beside_latencies = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        scrape(port)
        latencies.append(time.perf_counter() - began)
        began = time.perf_counter()
        scrape(beside)
        beside_latencies.append(time.perf_counter() - began)
        time.sleep(0.05)
    last = scrape(port), scrape(beside)

    def mean_pass(index: int) -> float:
        def grown(name: str) -> float:
            return (value(last[index], name) or 0) - (value(first[index], name) or 0)

        count = grown("procdelta_pass_duration_seconds_count")
        assert count >= 2, "fewer than two passes in the span"
        return grown("procdelta_pass_duration_seconds_sum") / count

    return latencies, mean_pass(0), mean_pass(1), beside_latencies


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def pod_totals(samples: dict, uid: str, name: str) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and ("uid", uid) in labels)


def test_a_tenants_storm_costs_the_pod_beside_it_nothing(tmp_path, capsys):
    pods = tenant_and_victim(tmp_path)
    _, (kind, tenant_path) = pods["tenant"]
    victim_uid, (_, victim_path) = pods["victim"]
    names = (f"--path.pod-logs={tmp_path / 'pods'}",
             f"--path.container-logs={tmp_path / 'containers'}")  # fmt: skip
    port, plain_port = free_port(), free_port()
    serve = start_serve(port, "--collector.exits", *names)
    plain = start_serve(plain_port, *names)  # the same passes without the records, beside
    workers: list[subprocess.Popen] = []
    try:
        with (
            pid_room(3 * TABLE),
            synthetic_table(TABLE, "idle"),
            cgroup(kind, tenant_path) as tenant,
            cgroup(kind, victim_path) as victim,
        ):
            wait_until(lambda: min(passes(port), passes(plain_port)) >= 4, 30, "four passes")
            rest, _, _, plain_rest = phase(port, SECONDS / 2, plain_port)
            lives = (
                f"{shlex.quote(sys.executable)} -c {shlex.quote(LIVES)} direct {SECONDS}; sleep 60"
            )
            workers.append(subprocess.Popen(["sh", "-c", f"{enter(victim)} && {lives}"],
                                            stdout=subprocess.PIPE, text=True))  # fmt: skip
            workers.append(subprocess.Popen(
                ["sh", "-c", f'{enter(tenant)} && exec "$@"', "sh",
                 "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 sys.executable, "-m", "collector.storm", "1000000", "0"],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            ))  # fmt: skip
            assert workers[1].stdout.readline().strip() == "ready", "the storm did not start"
            storm, storm_pass, plain_pass, plain_storm = phase(port, SECONDS, plain_port)
            workers[1].stdin.write("\n")
            workers[1].stdin.flush()
            made = int(workers[1].stdout.readline().split()[0])
            lived = int(workers[0].stdout.readline())
            workers[1].stdin.close()
            after = passes(port)
            wait_until(lambda: passes(port) >= after + 2, 30, "two passes after the lives")
            last = scrape(port)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
        for collector in (serve, plain):
            collector.terminate()
            collector.wait(timeout=10)
    counted = pod_totals(last, victim_uid, "procdelta_on_cpu_nanos_total")
    ran = pod_totals(last, victim_uid, "procdelta_cgroup_cpu_nanos_total")
    lost = value(last, "procdelta_exit_records_total", outcome="dropped")
    with capsys.disabled():
        print(
            f"\nstorm: {made / SECONDS:.0f} thread exits/s by one unprivileged process; the "
            f"pod beside it: {lived} lives, {counted / 1e9:.3f} s counted of {ran / 1e9:.3f} s "
            f"({counted / ran:.3f}); scrape p99 {p99(rest) * 1e3:.1f} → "
            f"{p99(storm) * 1e3:.1f} ms (without the records {p99(plain_rest) * 1e3:.1f} → "
            f"{p99(plain_storm) * 1e3:.1f} ms); a pass under it {plain_pass * 1e3:.1f} ms without "
            f"the records, {storm_pass * 1e3:.1f} ms with them; records dropped {lost:.0f}"
        )
    assert made / SECONDS > 10_000
    assert ran > 0.5 * SECONDS * 1e9
    assert counted >= 0.95 * ran
    # What the records cost, against a serve without them under the same storm: on two
    # CPUs a storm that takes one, beside lives that take the other, triples the scrapes'
    # p99 of a serve without the records too (docs/performance.md, "Exit records"), so
    # that comparison, not one with the rest before the storm, isolates the records.
    # Measured: p99 0.9-1.3x, a pass 1.2-1.5x; the bounds leave room for a noisy run.
    assert p99(storm) <= 2 * p99(plain_storm)
    assert storm_pass <= 2 * plain_pass

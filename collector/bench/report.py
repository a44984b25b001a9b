"""The bench's report: every table's rows echoed line by line as they come, the notes
below them, and the same lines as a Markdown page (`run`, `report`).
"""

from __future__ import annotations

import http.client
import math
import os
import time
from collections.abc import Callable

from collector.bench.floor import read_file
from collector.bench.latency import metrics_latency
from collector.bench.memory import serve_rss
from collector.bench.peers import exporter_legend
from collector.bench.rounds import TableResult, bench_table
from collector.bench.serve import SERVED_INTERVAL, SERVED_PASSES, SERVED_WARMUP, serve_idle_cpu
from collector.bench.served import VIEW_REQUESTS
from collector.bench.sizes import PageSize, echo_sizes, page_sizes
from collector.bench.tables import PID_MAX, tables


def run(
    rounds: int,
    pause: float,
    quick: bool,
    echo: Callable[[str], None],
    output: str | None = None,
) -> None:
    """Every table, echoed line by line; with `output`, the report is also written there
    as Markdown (the machine, the command, the table), the one place it is kept."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        echo(line)

    _run(rounds, pause, quick, say)
    if output is not None:
        with open(output, "w") as out:
            out.write(report(lines, rounds, pause, quick))


def report(lines: list[str], rounds: int, pause: float, quick: bool) -> str:
    """The bench's output as a Markdown page: when, on what, by which command."""
    uname = os.uname()
    command = f"procdelta bench --rounds {rounds} --pause {pause:g}" + (" --quick" if quick else "")
    return (
        "# procdelta bench: the latest recorded run\n\n"
        f"Written by `{command} --output docs/bench.md` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: Linux {uname.release}, "
        f"{os.cpu_count()} CPUs, pid_max {int(read_file(PID_MAX))}. "
        "[performance.md](performance.md) explains the tables; read the ratios (each round's "
        "pass over the same round's floor), not the absolute times.\n\n```\n"
        + "\n".join(lines)
        + "\n```\n"
    )


def _run(rounds: int, pause: float, quick: bool, echo: Callable[[str], None]) -> None:
    echo(f"{rounds} interleaved rounds per table, medians; 10% of processes have 20 threads.")
    echo("cpu = user+system CPU of one pass; ratios are to the naive floor (b) of the same run.")
    echo("ratio: median of the rounds' ratios (each round's pass over the same round's floor);")
    echo("spread: their middle half (25th to 75th percentile). Each pass, and the floor, runs")
    echo("in a process of its own, as a collector does (no party scans another's objects).")
    echo("Tables named pods spread the processes over 110 pod cgroups (2 containers each);")
    echo("in pods10 the processes of 10 of them run. skip: as procdelta runs; no-skip: a")
    echo("quiet cgroup's processes read anyway; no-cg: no cgroup fields; unbound: no whole")
    echo("reads (K = infinity), to weigh what the K-pass bound costs. Same rounds.")
    for line in exporter_legend():
        echo(line)
    for line in (
        f"served: what a node pays: a real `procdelta serve --interval {SERVED_INTERVAL:g}` in a",
        "process of its own over the same table after its rounds (a pods table's pods named",
        "as kubelet names them), scraped once a pass as Prometheus 3 scrapes (OpenMetrics,",
        "gzip), halfway between passes. cpu: the whole process's user+system CPU (every",
        "thread: the pass, building, rendering and compressing the page, GC, the scrapes)",
        f"over {SERVED_PASSES} passes after a warm-up of {SERVED_WARMUP}, divided by the passes "
        "its page counts",
        "in that span; naive: the floor's passes in that span (one after each scrape, in its",
        "own process: the machine's pace drifts between spans); ratio: cpu over naive;",
        "spread: the middle half of the pass-by-pass ratios (scrape to scrape). No wall",
        "time: a pass waits for its interval.",
        f"view: then {VIEW_REQUESTS} requests of /processes to the same served process "
        "(sorted by run",
        "delay, the first 20; view all: limit=0, every process), HTTP over 127.0.0.1 on a",
        "kept-alive connection, once a pass halfway between passes (one beside which a pass",
        "completed is left out). cpu: the serve process's CPU (every thread) for a request;",
        "wall: its latency at the client; naive: a floor pass after each request; ratio and",
        "spread: of the request-by-request ratios. Below the table: a request over the",
        "served row's CPU per pass.",
    ):
        echo(line)
    header = (
        f"{'table':<22} {'procs':>6} {'threads':>7} {'cpu ms':>8} {'wall ms':>8} "
        f"{'µs/proc':>8} {'µs/thr':>7} {'naive ms':>9} {'ratio':>6} {'spread':>10} "
        f"{'p-e ms':>8} {'p-e ratio':>9}"
    )
    echo(header)
    failures, notes, views = [], [], []
    shipped: list[tuple[str, list[PageSize]]] = []
    for table in tables(quick):
        served_cpu = math.nan  # the table's served row's CPU per pass, for its view rows

        def weigh(pods_file: str | None, name: str = table.name) -> None:
            assert pods_file is not None, "a table weighed has pods"
            shipped.append((name, page_sizes(pods_file)))

        for result in bench_table(
            table.name, table.processes, table.mode, rounds, pause, table.pods, table.variants,
            SERVED_PASSES if table.served else 0, weigh if table.sizes else None,
        ):  # fmt: skip
            echo_row(result, echo)
            if result.served is not None:
                served_cpu = result.served.cpu_per_pass
            if result.view is not None:
                views.append(view_note(result, served_cpu))
            if result.exporter_failed:
                failures.append(f"{result.name}: {result.exporter_failed}")
            if result.served_failed is not None:
                notes.append(f"{result.name}: no measure: {result.served_failed}")
            if result.served is not None and result.served.misaligned:
                notes.append(
                    f"{result.name}: {result.served.misaligned} scrape-to-scrape spans held no "
                    "pass or two (left out of the spread; the cpu per pass counts them all)"
                )
    for failure in failures:
        echo(f"prometheus-process-exporter could not keep up ({failure}): its scrapes stopped")
    for note in notes:
        echo(note)
    for view in views:
        echo(view)
    idle = serve_idle_cpu(10 if quick else 20)
    echo("")
    echo(f"procdelta serve between passes (none due, unscraped): {idle:.2f} ms of CPU per second;")
    echo(
        f"a pass carries {idle * 15:.1f} ms of it at the default --interval 15, "
        f"{idle * SERVED_INTERVAL:.1f} ms at {SERVED_INTERVAL:g} (the served rows)."
    )
    for name, sizes in shipped:
        echo_sizes(name, sizes, echo)
    if not quick:
        for processes in (1000, 5000):
            rss = serve_rss(processes)
            echo(f"RSS of procdelta serve over the N={processes} table: {rss:.1f} MB")
    latencies = metrics_latency()
    echo(
        f"/metrics with 1000 groups while passes run: p50 {_percentile(latencies, 0.5):.2f} ms, "
        f"p99 {_percentile(latencies, 0.99):.2f} ms over {len(latencies)} scrapes"
    )
    if not quick:
        # imported here: `python -m collector.bench.exitcost` runs it alone, as its __main__
        from collector.bench.exitcost import exit_costs, exit_legend, exit_lines

        echo("")
        for line in exit_legend():
            echo(line)
        try:
            costs = exit_costs()
        except (RuntimeError, OSError, http.client.HTTPException) as error:  # said, not raised
            echo(f"exit records: no measure: {type(error).__name__}: {error}")
        else:
            for line in exit_lines(costs):
                echo(line)


def echo_row(result: TableResult, echo: Callable[[str], None]) -> None:
    ours, naive = result.procdelta, result.naive
    if result.served_failed is not None:
        echo(f"{result.name:<22} {result.processes:>6} {result.threads:>7} {'failed':>8} (below)")
        return
    spread = (
        f"{_percentile(result.ratios, 0.25):.2f}-{_percentile(result.ratios, 0.75):.2f}"
        if result.ratios
        else "-"
    )
    if result.exporter_failed:
        exporter = f"{'failed':>8} {'-':>9}"
    elif result.exporter_cpu is not None:
        exporter = f"{result.exporter_cpu * 1e3:8.1f} {result.exporter_cpu / naive.cpu:9.2f}"
    else:
        exporter = f"{'-':>8} {'-':>9}"
    wall = f"{'-':>8}" if math.isnan(ours.wall) else f"{ours.wall * 1e3:8.1f}"
    echo(
        f"{result.name:<22} {result.processes:>6} {result.threads:>7} {ours.cpu * 1e3:8.1f} "
        f"{wall} {ours.cpu * 1e6 / result.processes:8.1f} "
        f"{ours.cpu * 1e6 / result.threads:7.2f} {naive.cpu * 1e3:9.1f} "
        f"{result.ratio:6.2f} {spread:>10} {exporter}"
    )


def view_note(result: TableResult, served_cpu: float) -> str:
    """A view row's request against its table's served pass: CPU, and what it answered."""
    view = result.view
    assert view is not None
    query = f"?{view.query}" if view.query else ""
    return (
        f"/processes{query} of {result.name}: {result.procdelta.cpu * 1e3:.1f} ms of CPU, "
        f"{result.procdelta.cpu / served_cpu:.2f} of a served pass ({served_cpu * 1e3:.1f} ms); "
        f"{view.listed} processes, {view.body_bytes / 1e3:.0f} kB of JSON"
        + (f"; {view.misaligned} beside a pass left out" if view.misaligned else "")
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

"""A table's rounds: each variant's pass and the floor in every round, then the served
process's rows over the same table (`bench_table`), one `TableResult` a row.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from collector.bench.floor import Sample, measured_apart, naive_pass
from collector.bench.peers import process_exporter, scrape_cpu
from collector.bench.serve import serve_process
from collector.bench.served import (
    VIEW_QUERIES,
    VIEW_REQUESTS,
    Served,
    ViewCost,
    measure_served,
    measure_view,
)
from collector.bench.tables import (
    DEFAULT_OPTIONS,
    pid_room,
    pod_cgroups,
    pod_names,
    synthetic_table,
)
from collector.wiring import Options


@dataclass
class TableResult:
    name: str
    processes: int
    threads: int
    procdelta: Sample
    naive: Sample
    ratios: list[float]  # procdelta's CPU over the floor's, round by round
    exporter_cpu: float | None
    exporter_failed: str | None = None  # why the exporter's scrapes were given up
    served: Served | None = None  # a served row: procdelta serve's whole CPU per pass
    served_failed: str | None = None  # a served row without a measure: why
    view: ViewCost | None = None  # a view row: requests of /processes to the served process

    @property
    def ratio(self) -> float:
        """A pass row: the median of the rounds' ratios. A served row: the whole span's CPU
        per pass over the floor (a garbage collection now and then counts, as on a node);
        `naive` is then the floor measured in the served span."""
        if self.served_failed is not None:
            return math.nan
        if self.served is not None:
            return self.served.cpu_per_pass / self.naive.cpu
        return statistics.median(self.ratios)


def _kept_in(out: list[Sample], run_pass: Callable[[], Sample]) -> Callable[[], None]:
    """A step of a round: one pass of a party, its sample added to `out`."""
    return lambda: out.append(run_pass())


def bench_table(
    name: str,
    processes: int,
    mode: str,
    rounds: int,
    pause: float,
    pods: int = 0,
    variants: tuple[tuple[str, Options], ...] | None = None,
    served_passes: int = 0,
    then: Callable[[str | None], None] | None = None,
) -> list[TableResult]:
    """One synthetic table; each variant's pass and the floor measured in every round (in
    a rotating order), so that variants are compared with the same floor. One result per
    variant (by default one: procdelta with its default options). Each variant, and the
    floor, runs in a process of its own (`pass_worker`). With `served_passes`, after the
    rounds, over the same table: a row for a real `procdelta serve` (`measure_served`, its
    pods named by `pod_names`), against the same floor. Then `then`, given the table's pods
    file (None without pods), while the table still runs."""
    variants = variants or ((name, DEFAULT_OPTIONS),)
    with (
        pid_room(processes * 3),  # 10% of processes with 20 threads: ~2.9 tasks each
        pod_cgroups(pods) as pods_file,
        synthetic_table(processes, mode, pods_file=pods_file),
        process_exporter() as exporter,
        measured_apart([options for _, options in variants] + [None]) as parties,
    ):
        engines, floor_pass = parties[:-1], parties[-1]
        for _ in range(2):  # warm: the cache holds the table, as in a running collector
            for run_pass in engines:
                run_pass()
            time.sleep(pause)
        ours: list[list[Sample]] = [[] for _ in engines]
        naive: list[Sample] = []
        exporter_cpu: list[float] = []
        exporter_failed: str | None = None
        seen = (0, 0)
        for round_ in range(rounds):
            time.sleep(pause)
            steps: list[Callable[[], None]] = [
                _kept_in(out, run_pass) for run_pass, out in zip(engines, ours, strict=True)
            ]
            steps.append(lambda: naive.append(floor_pass()))
            shift = round_ % len(steps)
            for step in steps[shift:] + steps[:shift]:
                step()
            if exporter is not None and exporter_failed is None:
                try:
                    exporter_cpu.append(scrape_cpu(exporter))
                except OSError as error:  # refused, reset, timed out, gone: it did not keep up
                    exporter_failed = f"{type(error).__name__} in round {round_ + 1}"
            seen = naive_pass()
        floor = Sample(
            statistics.median(s.cpu for s in naive), statistics.median(s.wall for s in naive)
        )
        whole: list[TableResult] = []
        if served_passes:
            whole = served_rows(name, pods_file, served_passes, seen, floor, floor_pass)
        if then is not None:
            then(pods_file)
    return [
        TableResult(
            label,
            seen[0],
            seen[1],
            Sample(
                statistics.median(s.cpu for s in samples),
                statistics.median(s.wall for s in samples),
            ),
            floor,
            [a.cpu / b.cpu for a, b in zip(samples, naive, strict=True)],
            None if exporter_failed else statistics.median(exporter_cpu) if exporter_cpu else None,
            exporter_failed,
        )
        for (label, _), samples in zip(variants, ours, strict=True)
    ] + whole


def served_rows(
    name: str,
    pods_file: str | None,
    passes: int,
    seen: tuple[int, int],
    floor: Sample,
    floor_pass: Callable[[], Sample] | None = None,
    queries: Sequence[tuple[str, str]] = VIEW_QUERIES,
    requests: int = VIEW_REQUESTS,
) -> list[TableResult]:
    """The served row, then a view row for each of `queries` (`measure_view`, the same
    served process after its measured passes). Each row's floor is `floor_pass`'s passes
    in its own span (`floor`, the rounds' floor, where there is none: the machine's pace
    drifts between spans). A serve that fails is one row saying why."""
    failures = (RuntimeError, OSError, http.client.HTTPException, ValueError, KeyError)

    def failed(label: str, error: Exception) -> TableResult:  # said, not raised
        why = f"{type(error).__name__}: {error}"
        nothing = Sample(math.nan, math.nan)
        return TableResult(label, seen[0], seen[1], nothing, floor, [], None, served_failed=why)

    label = f"{name} served"
    views: list[TableResult] = []
    try:
        with contextlib.ExitStack() as stack:
            args: list[str] = []
            if pods_file is not None:
                pod_logs, container_logs = stack.enter_context(pod_names(pods_file))
                args = ["--path.pod-logs", pod_logs, "--path.container-logs", container_logs]
            pid, scraper = stack.enter_context(serve_process(args))
            whole = measure_served(pid, scraper, passes, floor=floor_pass)
            for row, query in queries:
                try:
                    view = measure_view(pid, scraper, query, requests, floor=floor_pass)
                except failures as error:
                    views.append(failed(f"{name} {row}", error))
                    continue
                views.append(view_row(f"{name} {row}", seen, view, floor))
    except failures as error:
        return [failed(label, error)]
    if whole.floor:
        floor = Sample(statistics.median(whole.floor), math.nan)
    served_row = TableResult(
        label, seen[0], seen[1], Sample(whole.cpu_per_pass, math.nan), floor,
        [cpu / floor.cpu for cpu in whole.per_pass], None, None, whole,
    )  # fmt: skip
    return [served_row, *views]


def view_row(label: str, seen: tuple[int, int], view: ViewCost, floor: Sample) -> TableResult:
    """A view row: the median request's CPU and latency; its ratios, request by request,
    to the floor's pass after it (`floor`, where none was run)."""
    floors = view.floor or [floor.cpu] * len(view.cpu)
    return TableResult(
        label, seen[0], seen[1],
        Sample(statistics.median(view.cpu), statistics.median(view.wall)),
        Sample(statistics.median(floors), math.nan),
        [cpu / f for cpu, f in zip(view.cpu, floors, strict=True)], None, view=view,
    )  # fmt: skip

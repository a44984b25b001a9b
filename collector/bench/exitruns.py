"""The arithmetic of the exit records' table (exitcost.py): the counters a span of a served
run is read against at each end (`Mark`, from its page, the storm's count and the node's
tasks), a run between two marks (`ExitRun`), and a rate's rounds (`ExitCost`): the medians,
the rounds' ratios and the extra CPU per record, each round against its own."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from collector.bench.serve import Page


@dataclass(frozen=True)
class StormCount:
    """What the storm had done at an instant: its exits, its CPU (ns), and when (ns,
    CLOCK_MONOTONIC)."""

    made: int
    cpu_ns: int
    at_ns: int


def exit_outcomes(page: Page) -> dict[str, int] | None:
    """`procdelta_exit_records_total` of a page, by outcome; None where it has none (a
    serve without `--collector.exits`, or one that could not listen)."""
    found = re.findall(
        rb'^procdelta_exit_records_total\{outcome="(\w+)"\} (\S+)', page.text, re.MULTILINE
    )
    return {outcome.decode(): int(float(value)) for outcome, value in found} or None


def exit_records(page: Page) -> int | None:
    """The exit records a page counted: every outcome but `unplaced` (a record counted
    under `closed` or `born` too), `dropped` (past the queue's bound) included."""
    outcomes = exit_outcomes(page)
    if outcomes is None:
        return None
    return sum(count for outcome, count in outcomes.items() if outcome != "unplaced")


@dataclass(frozen=True)
class Mark:
    """What a run's span is read against, at one of its ends."""

    at: float  # s, monotonic
    storm: StormCount
    tasks: int  # the node's, `tasks_made`
    records: int | None  # the page's, `exit_records`
    dropped: int | None  # of them, those past the queue's bound
    overflows: int | None  # the page's `procdelta_exit_record_overflows_total`
    pass_seconds: float  # the page's `procdelta_pass_duration_seconds_sum`
    passes: int  # its `_count`
    outcomes: Mapping[str, int] | None = None  # the page's records by outcome


def mark(page: Page, storm: StormCount, tasks: int, at: float) -> Mark:
    """A span's end: the page's counters, with the storm's count and the node's tasks."""
    overflows = page.value("procdelta_exit_record_overflows_total")
    outcomes = exit_outcomes(page)
    return Mark(
        at,
        storm,
        tasks,
        exit_records(page),
        None if outcomes is None else outcomes.get("dropped", 0),
        None if overflows is None else int(overflows),
        page.value("procdelta_pass_duration_seconds_sum") or 0.0,
        int(page.value("procdelta_pass_duration_seconds_count") or 0),
        outcomes,
    )


@dataclass(frozen=True)
class ExitRun:
    """One run of `serve` beside the storm: its span of passes, and what happened in it."""

    exits: bool  # with --collector.exits
    cpu: float  # s: the serve process's CPU over the span (every thread)
    seconds: float  # the span's wall time
    passes: int
    pass_seconds: float  # the passes' own time in the span (the page's pass durations)
    made: int  # exits the storm made in the span
    storm_cpu: float  # s: the storm's CPU in the span (its threads', its children's)
    tasks: int  # tasks the node made in the span
    records: int | None  # exit records the page counted in the span (with the flag)
    dropped: int | None  # of them, those past the queue's bound (lost)
    overflows: int | None  # times the records' socket overflowed in the span (with the flag)
    peak_rss: float = 0.0  # MB: the serve process's peak resident memory (VmHWM), at its end
    outcomes: Mapping[str, int] | None = None  # the records of the span by outcome

    @property
    def cpu_per_second(self) -> float:
        return self.cpu / self.seconds

    @property
    def made_per_second(self) -> float:
        return self.made / self.seconds

    @property
    def records_per_second(self) -> float:
        return (self.records or 0) / self.seconds

    @property
    def per_pass(self) -> float:
        """s: a pass's own time, the span's mean."""
        return self.pass_seconds / self.passes


def run_between(exits: bool, cpu: float, start: Mark, end: Mark, peak_rss: float = 0.0) -> ExitRun:
    """A run from the marks at its span's ends."""

    def between(first: int | None, last: int | None) -> int | None:
        return None if first is None or last is None else last - first

    return ExitRun(
        exits=exits,
        cpu=cpu,
        seconds=end.at - start.at,
        passes=end.passes - start.passes,
        pass_seconds=end.pass_seconds - start.pass_seconds,
        made=end.storm.made - start.storm.made,
        storm_cpu=(end.storm.cpu_ns - start.storm.cpu_ns) / 1e9,
        tasks=end.tasks - start.tasks,
        records=between(start.records, end.records),
        dropped=between(start.dropped, end.dropped),
        overflows=between(start.overflows, end.overflows),
        peak_rss=peak_rss,
        outcomes=None
        if start.outcomes is None or end.outcomes is None
        else {k: v - start.outcomes.get(k, 0) for k, v in end.outcomes.items()},
    )


def median(values: Iterable[float]) -> float:
    found = list(values)
    return statistics.median(found) if found else math.nan


@dataclass
class ExitCost:
    """One rate's rounds: in each, a run without the flag and one with it."""

    rate: float  # exits a second asked of the storm
    rounds: list[tuple[ExitRun, ExitRun]]  # (without, with)

    @property
    def made_per_second(self) -> float:
        """The exits the storm made a second, the median run's."""
        return median(r.made_per_second for pair in self.rounds for r in pair)

    @property
    def records_per_second(self) -> float:
        """The records the page counted a second, the median run's with the flag."""
        return median(w.records_per_second for _, w in self.rounds)

    @property
    def without(self) -> float:
        """s of the serve process's CPU a second, the median run's without the flag."""
        return median(wo.cpu_per_second for wo, _ in self.rounds)

    @property
    def with_(self) -> float:
        return median(w.cpu_per_second for _, w in self.rounds)

    @property
    def ratios(self) -> list[float]:
        """Each round's CPU a second with the flag over that without it; not of a round whose
        run without it measured no CPU (a run shorter than the CPU clock's tick)."""
        return [w.cpu_per_second / wo.cpu_per_second for wo, w in self.rounds if wo.cpu_per_second]

    @property
    def ratio(self) -> float:
        """The rounds' ratios' median; NaN where no round has one."""
        return median(self.ratios)

    @property
    def per_record(self) -> float:
        """s of CPU an exit record costs the served process: each round's CPU a second with
        the flag less that without it, over the records its run with the flag counted a
        second; the median (NaN where no run counted any)."""
        return median(
            (w.cpu_per_second - wo.cpu_per_second) / w.records_per_second
            for wo, w in self.rounds
            if w.records
        )

    def guard(self, processes: int, interval: float) -> float:
        """A record's cost (`per_record`) over what a pass without the flag costs the
        served process for each process of the table (its CPU a second times the interval,
        over `processes`): machine-independent, as both are measured in the same run; NaN
        where either is not known."""
        if not processes or math.isnan(self.per_record) or not self.without:
            return math.nan
        return self.per_record / (self.without * interval / processes)

    @property
    def records(self) -> int:
        """Records counted by the runs with the flag, all rounds."""
        return sum(w.records or 0 for _, w in self.rounds)

    @property
    def made(self) -> int:
        """Exits the storm made in the spans of the runs with the flag."""
        return sum(w.made for _, w in self.rounds)

    @property
    def tasks(self) -> int:
        """Tasks the node made in the same spans, the storm's among them."""
        return sum(w.tasks for _, w in self.rounds)

    @property
    def dropped(self) -> int:
        return sum(w.dropped or 0 for _, w in self.rounds)

    @property
    def outcomes(self) -> Counter[str]:
        """What the records of the runs with the flag came to, by outcome."""
        found: Counter[str] = Counter()
        for _, w in self.rounds:
            found.update(w.outcomes or {})
        return found

    @property
    def overflows(self) -> int:
        return sum(w.overflows or 0 for _, w in self.rounds)

    @property
    def storm_extra(self) -> float:
        """s of the storm's CPU an exit, with this serve's listener registered less without
        it: the kernel making and sending the record, in the exiting task; each round's
        difference, the median."""
        return median(w.storm_cpu / w.made - wo.storm_cpu / wo.made for wo, w in self.rounds)

    @property
    def passes(self) -> tuple[float, float]:
        """s: a pass's own time without the flag and with it (the medians of the runs')."""
        return (
            median(wo.per_pass for wo, _ in self.rounds),
            median(w.per_pass for _, w in self.rounds),
        )

    @property
    def peak_rss(self) -> tuple[float, float]:
        """MB: the serve process's peak RSS without the flag and with it (the medians)."""
        return (
            median(wo.peak_rss for wo, _ in self.rounds),
            median(w.peak_rss for _, w in self.rounds),
        )

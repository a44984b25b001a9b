"""The `/metrics` page (docs/reference.md §5), rendered once per pass as Prometheus text
and OpenMetrics.

prometheus_client renders every value through a float (`4.026139228e+09`, and inexact
past 2**53); docs/reference.md §5 asks for exact integers, so the families procdelta owns are
rendered here, in the two formats' plain grammar. prometheus_client still provides the
float formatting, the collector's own `process_*` metrics and, in the tests, the parsers
that check this output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from prometheus_client.utils import floatToGoString

from collector.aggregate import FootprintSums
from collector.groups import Group
from collector.model import (
    CGROUP_FIELD_NAMES,
    CGROUP_REFUSAL_REASONS,
    COUNTER_FIELD_NAMES,
    FIELD_NAMES,
    REFUSAL_REASONS,
    THREAD_REFUSAL_REASONS,
    CgroupFields,
    Fields,
)

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, int | float]

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

PASS_DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family. `name` is the base name: a counter's samples add `_total`."""

    name: str
    kind: str  # "gauge", "counter" or "histogram"
    help: str
    samples: tuple[Sample, ...]


_FIELD_HELP = {
    "processes": "Processes that contributed a delta",
    "observed_nanos": "Process-time observed, the denominator of every rate (ns)",
    "on_cpu_nanos": "Time on a CPU, summed over threads (ns)",
    "run_delay_nanos": "Time runnable but waiting for a CPU, summed over threads (ns)",
    "cpu_user_nanos": "User CPU time (ns)",
    "cpu_system_nanos": "System CPU time (ns)",
    "major_faults": "Major page faults",
    "voluntary_switches": "Voluntary context switches, summed over threads",
    "nonvoluntary_switches": "Involuntary context switches, summed over threads",
    "read_bytes": "Bytes really fetched from storage, summed over threads",
    "write_bytes": "Bytes really sent to storage, summed over threads",
    # docs/reference.md §7: the group's own cgroup (the unit is in each name: _nanos)
    "cgroup_cpu_nanos": "CPU time of every task of the group's cgroup, exited ones included (ns)",
    "cpu_periods": "CFS bandwidth periods with runnable tasks, the group's cgroup and below",
    "cpu_throttled_periods": "CFS bandwidth periods throttled by the quota, cgroup and below",
    "cpu_throttled_nanos": "Time throttled by the CFS quota, cgroup and below (runqueue ns)",
    "cpu_pressure_waiting_nanos": "Time some tasks of the cgroup waited for a CPU (PSI some)",
    "cpu_pressure_stalled_nanos": "Time all tasks of the cgroup waited for a CPU (PSI full)",
    "memory_pressure_waiting_nanos": "Time some tasks of the cgroup stalled on memory (PSI some)",
    "memory_pressure_stalled_nanos": "Time all tasks of the cgroup stalled on memory (PSI full)",
    "io_pressure_waiting_nanos": "Time some tasks of the cgroup stalled on I/O (PSI some)",
    "io_pressure_stalled_nanos": "Time all tasks of the cgroup stalled on I/O (PSI full)",
}


@dataclass(frozen=True, slots=True)
class Shapes:
    """Which per-group families are exported: the operator's trade of series for detail."""

    interval_gauges: bool = True  # procdelta_interval_<field>
    totals: bool = True  # procdelta_<field>_total
    cgroup: bool = True  # the docs/reference.md §7 fields (and their self-metrics)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram's state: counts per upper bound (+Inf last), sum, count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float
    count: int

    @classmethod
    def empty(cls, bounds: tuple[float, ...] = PASS_DURATION_BUCKETS) -> Histogram:
        return cls(bounds, (0,) * (len(bounds) + 1), 0.0, 0)

    def observe(self, value: float) -> Histogram:
        counts = tuple(
            c + (1 if index == len(self.bounds) or value <= self.bounds[index] else 0)
            for index, c in enumerate(self.counts)
        )
        return Histogram(self.bounds, counts, self.total + value, self.count + 1)


@dataclass(frozen=True, slots=True)
class SelfState:
    """The collector's own cumulative state, as of the pass being published."""

    version: str
    passes: int = 0
    failed_passes: int = 0
    dropped: Mapping[str, int] | None = None
    dropped_threads: Mapping[str, int] | None = None
    durations: Histogram = field(default_factory=Histogram.empty)
    interval_seconds: float | None = None
    last_pass_timestamp: float | None = None
    tracked_processes: int = 0
    tracked_threads: int = 0
    dropped_cgroups: Mapping[str, int] | None = None  # None: cgroup fields not collected
    tracked_cgroups: int = 0
    skipped_processes: int = 0
    sources: Mapping[str, bool] | None = None


def _group_samples(values: Iterable[tuple[Group, int]], suffix: str = "") -> tuple[Sample, ...]:
    return tuple((suffix, group.labels, value) for group, value in values)


def _sorted(mapping: Mapping[Group, object]) -> list[Group]:
    return sorted(mapping, key=lambda group: (group.kind, group.labels))


def build_families(
    intervals: Mapping[Group, Fields],
    totals: Mapping[Group, Mapping[str, int]],
    footprints: Mapping[Group, FootprintSums],
    state: SelfState,
    cgroup_intervals: Mapping[Group, CgroupFields] | None = None,
    shapes: Shapes | None = None,
) -> list[Family]:
    """Every family of docs/reference.md §5 (and §7), series in a stable order."""
    families: list[Family] = []
    cgroup_intervals = cgroup_intervals or {}
    shapes = shapes or Shapes()
    if shapes.interval_gauges:
        interval_groups = _sorted(intervals)
        for name in FIELD_NAMES:
            families.append(
                _interval_family(name, ((g, getattr(intervals[g], name)) for g in interval_groups))
            )
        if shapes.cgroup:
            cgroup_groups = _sorted(cgroup_intervals)
            for name in CGROUP_FIELD_NAMES:
                values = ((g, getattr(cgroup_intervals[g], name)) for g in cgroup_groups)
                families.append(
                    _interval_family(name, ((g, v) for g, v in values if v is not None))
                )
    if shapes.totals:
        total_groups = _sorted(totals)
        names = COUNTER_FIELD_NAMES + (CGROUP_FIELD_NAMES if shapes.cgroup else ())
        for name in names:
            families.append(
                Family(
                    f"procdelta_{name}",
                    "counter",
                    f"{_FIELD_HELP[name]}; accumulated since the collector started.",
                    _group_samples(
                        ((g, totals[g][name]) for g in total_groups if name in totals[g]), "_total"
                    ),
                )
            )
    footprint_groups = _sorted(footprints)
    for name, help_text in (
        ("processes", "Processes seen by the last pass, with a delta or not."),
        ("threads", "Threads of the processes seen by the last pass."),
        ("rss_bytes", "Resident memory of the processes seen by the last pass (bytes)."),
    ):
        families.append(
            Family(
                f"procdelta_footprint_{name}",
                "gauge",
                help_text,
                _group_samples((g, getattr(footprints[g], name)) for g in footprint_groups),
            )
        )
    families.extend(_self_families(state))
    return families


def _interval_family(name: str, values: Iterable[tuple[Group, int]]) -> Family:
    return Family(
        f"procdelta_interval_{name}",
        "gauge",
        f"{_FIELD_HELP[name]}; the last completed interval.",
        _group_samples(values),
    )


def _by_reason(counts: Mapping[str, int] | None, reasons: tuple[str, ...]) -> tuple[Sample, ...]:
    """One `_total` sample per reason, in the given order; 0 for one not counted yet."""
    counts = counts or {}
    return tuple(("_total", (("reason", reason),), counts.get(reason, 0)) for reason in reasons)


def _self_families(state: SelfState) -> list[Family]:
    durations = state.durations
    buckets: list[Sample] = [
        ("_bucket", (("le", floatToGoString(bound)),), count)
        for bound, count in zip(durations.bounds, durations.counts[:-1], strict=True)
    ]
    buckets.append(("_bucket", (("le", "+Inf"),), durations.counts[-1]))
    buckets.append(("_sum", (), durations.total))
    buckets.append(("_count", (), durations.count))
    families = [
        Family(
            "procdelta_pass_duration_seconds",
            "histogram",
            "Wall time of a pass over /proc.",
            tuple(buckets),
        ),
        Family(
            "procdelta_passes",
            "counter",
            "Passes completed over /proc.",
            (("_total", (), state.passes),),
        ),
        Family(
            "procdelta_failed_passes",
            "counter",
            "Passes that failed as a whole (e.g. the proc filesystem could not be listed).",
            (("_total", (), state.failed_passes),),
        ),
        Family(
            "procdelta_dropped_deltas",
            "counter",
            "Processes that contributed no delta to a pass, by reason.",
            _by_reason(state.dropped, REFUSAL_REASONS),
        ),
        Family(
            "procdelta_dropped_thread_deltas",
            "counter",
            "Threads of contributing processes whose delta was left out of a pass, by reason.",
            _by_reason(state.dropped_threads, THREAD_REFUSAL_REASONS),
        ),
        *(
            ()
            if state.dropped_cgroups is None
            else (
                Family(
                    "procdelta_dropped_cgroup_deltas",
                    "counter",
                    "Groups whose cgroup gave no delta to a pass, by reason.",
                    _by_reason(state.dropped_cgroups, CGROUP_REFUSAL_REASONS),
                ),
                Family(
                    "procdelta_tracked_cgroups",
                    "gauge",
                    "Groups whose cgroup the last pass read.",
                    (("", (), state.tracked_cgroups),),
                ),
                Family(
                    "procdelta_skipped_processes",
                    "gauge",
                    "Processes the last pass did not read: their cgroup's CPU usage had "
                    "not moved, so their last reading was carried over.",
                    (("", (), state.skipped_processes),),
                ),
            )
        ),
        *(
            ()
            if state.sources is None
            else (
                Family(
                    "procdelta_source_available",
                    "gauge",
                    "Whether the node provides a source the fields depend on (1) or not (0).",
                    tuple(
                        ("", (("source", name),), int(found))
                        for name, found in state.sources.items()
                    ),
                ),
            )
        ),
        Family(
            "procdelta_tracked_processes",
            "gauge",
            "Processes in the delta cache.",
            (("", (), state.tracked_processes),),
        ),
        Family(
            "procdelta_tracked_threads",
            "gauge",
            "Threads in the delta cache.",
            (("", (), state.tracked_threads),),
        ),
        Family(
            "procdelta_build_info",
            "gauge",
            "A metric with a constant '1' value labelled by the version of procdelta.",
            (("", (("version", state.version),), 1),),
        ),
    ]
    if state.interval_seconds is not None:
        families.append(
            Family(
                "procdelta_interval_seconds",
                "gauge",
                "Wall length of the last completed interval.",
                (("", (), state.interval_seconds),),
            )
        )
    if state.last_pass_timestamp is not None:
        families.append(
            Family(
                "procdelta_last_pass_timestamp_seconds",
                "gauge",
                "Unix time at which the last pass completed.",
                (("", (), state.last_pass_timestamp),),
            )
        )
    return families


def _value(value: int | float) -> str:
    return str(value) if isinstance(value, int) else floatToGoString(value)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@lru_cache(maxsize=65536)
def _labels(labels: Labels) -> str:
    """`{name="value",…}`, rendered once per label set (groups outlive passes)."""
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in labels) + "}"


def _sample_block(family: Family) -> bytes:
    """A family's sample lines: the same in both formats, so rendered once for both."""
    name = family.name
    return "".join(
        f"{name}{suffix}{_labels(labels)} {_value(value)}\n"
        for suffix, labels, value in family.samples
    ).encode()


def _text_header(family: Family) -> bytes:
    name = family.name + ("_total" if family.kind == "counter" else "")
    help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {family.kind}\n".encode()


def _openmetrics_header(family: Family) -> bytes:
    help_text = _escape_label(family.help)
    return f"# HELP {family.name} {help_text}\n# TYPE {family.name} {family.kind}\n".encode()


def render_both(families: Iterable[Family]) -> tuple[bytes, bytes]:
    """(Prometheus text 0.0.4, OpenMetrics 1.0 without its closing `# EOF`)."""
    text: list[bytes] = []
    openmetrics: list[bytes] = []
    for family in families:
        block = _sample_block(family)
        text += (_text_header(family), block)
        openmetrics += (_openmetrics_header(family), block)
    return b"".join(text), b"".join(openmetrics)


def render_text(families: Iterable[Family]) -> bytes:
    """The Prometheus text format, version 0.0.4."""
    return render_both(families)[0]


def render_openmetrics(families: Iterable[Family], eof: bool = True) -> bytes:
    """OpenMetrics 1.0 text. Without `eof`, for a page that other families follow."""
    body = render_both(families)[1]
    return body + b"# EOF\n" if eof else body

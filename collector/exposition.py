"""The `/metrics` page (docs/reference.md §5), rendered once per pass as Prometheus text
and OpenMetrics.

prometheus_client renders every value through a float (`4.026139228e+09`, and inexact
past 2**53); docs/reference.md §5 asks for exact integers, so the families procdelta owns are
rendered here, in the two formats' plain grammar. prometheus_client still provides the
float formatting, the collector's own `process_*` metrics and, in the tests, the parsers
that check this output.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter

from prometheus_client.utils import floatToGoString

try:  # ISA-L's deflate (python-isal): ~3.5x the speed of zlib's level 1, as small a page
    from isal import isal_zlib as deflate
except ImportError:  # no wheel for this machine: the standard library's
    import zlib as deflate  # type: ignore[no-redef]  # (the same functions, another module)

from collector import fieldtable
from collector.aggregate import FootprintSums
from collector.cpusets import parse_cpu_list
from collector.groups import Group
from collector.model import (
    CGROUP_FIELD_NAMES,
    CGROUP_REFUSAL_REASONS,
    COUNTER_FIELD_NAMES,
    EXIT_OUTCOMES,
    EXIT_REFUSAL_REASONS,
    FIELD_NAMES,
    REFUSAL_REASONS,
    THREAD_REFUSAL_REASONS,
    CgroupFields,
    CpuSet,
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
    **fieldtable.HELP,  # docs/reference.md §3
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
    # why it waited, on the node (collector/waits.py): from CPU pressure, wall time ...
    "cpu_stalled_throttled_nanos": "Time its tasks waited, held by its CPU quotas (PSI full, ns)",
    "cpu_stalled_neighbours_nanos": "Time its tasks waited behind other groups' (PSI full, ns)",
    "cpu_waiting_own_threads_nanos": "Time its tasks waited behind its own (PSI some - full, ns)",
    # ... or, without it, its run delay split on the interval's averages, thread-time
    "run_delay_throttled_nanos": "Run delay its own CPU quotas explain (ns)",
    "run_delay_own_threads_nanos": "Run delay queued behind its own threads, beyond the CPUs (ns)",
    "run_delay_neighbours_nanos": "Run delay while other groups held the CPUs it could use (ns)",
    "run_delay_runnable_nanos": "On-CPU + run delay of the passes whose run delay was split (ns)",
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
    carried_processes: int = 0  # procdelta_skipped_processes
    sources: Mapping[str, bool] | None = None
    node_cpus: int | None = None  # the node's online CPUs, read each pass
    # exit records (`--collector.exits`): by outcome, None where not listening; the times
    # the socket overflowed, and the records past the queue's bound; what the tasks no
    # group placed added, on-CPU and run delay (ns)
    exits: Mapping[str, int] | None = None
    exit_overflows: int = 0
    exits_dropped: int = 0
    exits_refused: Mapping[str, int] | None = None  # datagrams refused, by reason
    exits_unplaced: tuple[int, int] = (0, 0)
    exits_lost: Mapping[Group, int] | None = None  # records dropped, by group


def _sorted(mapping: Mapping[Group, object]) -> list[Group]:
    return sorted(mapping, key=lambda group: (group.kind, group.labels))


@dataclass(frozen=True, slots=True)
class GroupFamily:
    """A family with one sample per group, fed by one mapping of the pass (`source`):
    `intervals` (Fields), `cgroup_intervals` (CgroupFields), `totals` (a dict of counters)
    or `footprints` (FootprintSums); `field` names the value in it (none: no sample)."""

    name: str
    kind: str
    help: str
    source: str
    field: str
    suffix: str = ""
    label: str = ""  # a label of its own, whose value comes with the sample's: (value, n)

    def line(self, group: Group, value: int | tuple[str, int] | None) -> bytes:
        """The family's sample line for a group, b"" where the group has no value."""
        if value is None:
            return b""
        labels = group.labels
        if self.label:
            assert isinstance(value, tuple)
            labels, value = (*labels, (self.label, value[0])), value[1]
        # `value` is a number here: a tuple only where the family has a label (taken apart
        # above), which the checker cannot tie to `self.label` (and no check on each line)
        return b"%s%s %d\n" % (  # type: ignore[str-format]
            _name_bytes(self.name, self.suffix),
            _label_bytes(labels),
            value,
        )


SOURCES = ("intervals", "cgroup_intervals", "totals", "footprints", "cpusets")

_FOOTPRINT_HELP = (
    ("processes", "Processes seen by the last pass, with a delta or not."),
    ("threads", "Threads of the processes seen by the last pass."),
    ("rss_bytes", "Resident memory of the processes seen by the last pass (bytes)."),
)


@lru_cache(maxsize=16)
def group_families(shapes: Shapes) -> tuple[GroupFamily, ...]:
    """The per-group families of docs/reference.md §5 (and §7), in the page's order."""
    families: list[GroupFamily] = []
    if shapes.interval_gauges:
        sources = [("intervals", FIELD_NAMES)]
        if shapes.cgroup:
            sources.append(("cgroup_intervals", CGROUP_FIELD_NAMES))
        families += [
            GroupFamily(f"procdelta_interval_{n}", "gauge",
                        f"{_FIELD_HELP[n]}; the last completed interval.", source, n)
            for source, names in sources
            for n in names
        ]  # fmt: skip
    if shapes.totals:
        names = COUNTER_FIELD_NAMES + (CGROUP_FIELD_NAMES if shapes.cgroup else ())
        families += [
            GroupFamily(f"procdelta_{n}", "counter",
                        f"{_FIELD_HELP[n]}; accumulated since the collector started.",
                        "totals", n, "_total")
            for n in names
        ]  # fmt: skip
    families += [
        GroupFamily(f"procdelta_footprint_{n}", "gauge", help_text, "footprints", n)
        for n, help_text in _FOOTPRINT_HELP
    ]
    if shapes.cgroup:
        families.append(
            GroupFamily(
                "procdelta_cpuset_cpus",
                "gauge",
                "CPUs the group's processes that ran in the last interval may use (the "
                "union of their cgroups' effective cpusets), as `cpus`: the kernel's list, "
                "or all.",
                "cpusets",
                "",
                label="cpus",
            )
        )
    return tuple(families)


CPUSET_MEMBER_HELP = (
    "1 for each CPU of each list `cpus` that procdelta_cpuset_cpus shows on this node (not "
    "all), as `cpu`: joined on `cpu`, two groups share a CPU where their lists do."
)


def cpuset_members(
    cpusets: Mapping[Group, CpuSet], known: dict[str, tuple[int, ...]] | None = None
) -> Family:
    """`procdelta_cpuset_member`: the CPUs of each distinct list among the groups' sets
    (not `all`, which shares every CPU), so that PromQL can ask whether two lists overlap
    (a daemon on `0-1` shares CPUs with a pod on `0-1,14-15`). A node has few lists (the
    shared pool, each exclusive pod's, the reserved CPUs): at most a series for each of its
    CPUs per list. `known` keeps each list's CPUs from pass to pass."""
    known = {} if known is None else known
    lists = sorted({s.cpus for s in cpusets.values() if s.cpus != "all"})
    for gone in known.keys() - set(lists):  # no group shows it any more
        del known[gone]
    samples: list[Sample] = []
    for cpus in lists:
        if cpus not in known:
            mask = parse_cpu_list(cpus.encode())
            known[cpus] = tuple(cpu for cpu in range(mask.bit_length()) if mask >> cpu & 1)
        samples += [("", (("cpus", cpus), ("cpu", str(cpu))), 1) for cpu in known[cpus]]
    return Family("procdelta_cpuset_member", "gauge", CPUSET_MEMBER_HELP, tuple(samples))


def _row_getter(source: str, fields: tuple[str, ...]) -> Callable[..., tuple]:
    """A group's values for `fields`, from its entry in one source mapping, as a tuple.
    (Called with the entry, of whatever type that source holds: chosen by its name.)"""
    if source == "cpusets":  # a CpuSet: its list (a label) and its count
        return lambda cpuset: (tuple(cpuset),)
    if source == "totals":
        return lambda counters: tuple(map(counters.get, fields))
    get = attrgetter(*fields)
    return (lambda data: (get(data),)) if len(fields) == 1 else get


def _by_reason(counts: Mapping[str, int] | None, reasons: tuple[str, ...]) -> tuple[Sample, ...]:
    """One `_total` sample per reason, in the given order; 0 for one not counted yet."""
    counts = counts or {}
    return tuple(("_total", (("reason", reason),), counts.get(reason, 0)) for reason in reasons)


def _exit_families(state: SelfState) -> list[Family]:
    exits = state.exits or {}
    on_cpu, run_delay = state.exits_unplaced
    return [
        Family(
            "procdelta_exit_records",
            "counter",
            "The kernel's exit records taken (--collector.exits), by what each came to.",
            (
                *(
                    ("_total", (("outcome", outcome),), exits.get(outcome, 0))
                    for outcome in EXIT_OUTCOMES
                ),
                ("_total", (("outcome", "dropped"),), state.exits_dropped),
            ),
        ),
        Family(
            "procdelta_exit_messages_refused",
            "counter",
            "Datagrams on the exit records' socket refused (--collector.exits): not sent by "
            "the kernel, not of the TASKSTATS family, or not a well-formed record.",
            _by_reason(state.exits_refused, EXIT_REFUSAL_REASONS),
        ),
        Family(
            "procdelta_exit_records_lost",
            "counter",
            "Exit records dropped past the listener's bound, by the group of their tasks' "
            "parent (--collector.exits): a storm's go first.",
            tuple(
                ("_total", group.labels, count)
                for group, count in sorted(
                    (state.exits_lost or {}).items(), key=lambda item: item[0].labels
                )
            ),
        ),
        Family(
            "procdelta_exit_record_overflows",
            "counter",
            "Times the exit records' socket buffer overflowed: records lost, how many the "
            "kernel does not say (--collector.exits.buffer-bytes).",
            (("_total", (), state.exit_overflows),),
        ),
        Family(
            "procdelta_exits_unplaced_on_cpu_nanos",
            "counter",
            "On-CPU time of exited tasks no file placed in a group (ns).",
            (("_total", (), on_cpu),),
        ),
        Family(
            "procdelta_exits_unplaced_run_delay_nanos",
            "counter",
            "Run delay of exited tasks no file placed in a group (ns).",
            (("_total", (), run_delay),),
        ),
    ]


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
                    (("", (), state.carried_processes),),
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
    if state.exits is not None:
        families += _exit_families(state)
    if state.node_cpus is not None:
        families.append(
            Family(
                "procdelta_node_cpus",
                "gauge",
                "CPUs online on the node: the denominator of its saturation (every "
                "group's on-CPU time and run delay per second).",
                (("", (), state.node_cpus),),
            )
        )
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


@lru_cache(maxsize=65536)
def _label_bytes(labels: Labels) -> bytes:
    return _labels(labels).encode()


@lru_cache(maxsize=256)
def _name_bytes(name: str, suffix: str) -> bytes:
    return (name + suffix).encode()


def _sample_block(family: Family) -> bytes:
    """A family's sample lines: the same in both formats, so rendered once for both."""
    name = family.name
    return "".join(
        f"{name}{suffix}{_labels(labels)} {_value(value)}\n"
        for suffix, labels, value in family.samples
    ).encode()


@lru_cache(maxsize=256)
def _text_header(name: str, kind: str, help_text: str) -> bytes:
    name += "_total" if kind == "counter" else ""
    help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n".encode()


@lru_cache(maxsize=256)
def _openmetrics_header(name: str, kind: str, help_text: str) -> bytes:
    return f"# HELP {name} {_escape_label(help_text)}\n# TYPE {name} {kind}\n".encode()


def gzip_member(data: bytes, level: int = 1) -> bytes:
    """A gzip member (`deflate`: ISA-L's where it is installed, as the package asks; else
    zlib's). Deflating releases the interpreter lock, so scrapes are answered while a page
    compresses."""
    compressor = deflate.compressobj(level, deflate.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


class Page:
    """One pass's page: each family's name, type, help and sample lines (the same in both
    formats). Each format, plain or gzipped, is joined the first time a scraper asks for
    it, once (under a lock: a burst of scrapes waits for the one join), and kept."""

    __slots__ = ("_bodies", "_lock", "families")

    def __init__(self, families: tuple[tuple[str, str, str, bytes], ...]):
        self.families = families
        self._bodies: dict[tuple[bool, bool], bytes] = {}
        self._lock = threading.Lock()

    def body(self, openmetrics: bool, gzipped: bool = False) -> bytes:
        """The page in one format (OpenMetrics without its closing `# EOF`)."""
        key = (openmetrics, gzipped)
        body = self._bodies.get(key)
        if body is not None:
            return body
        plain = self.body(openmetrics) if gzipped else b""
        with self._lock:
            body = self._bodies.get(key)
            if body is None:
                body = gzip_member(plain) if gzipped else self._join(openmetrics)
                self._bodies[key] = body
        return body

    def _join(self, openmetrics: bool) -> bytes:
        header = _openmetrics_header if openmetrics else _text_header
        parts: list[bytes] = []
        for name, kind, help_text, block in self.families:
            parts += (header(name, kind, help_text), block)
        return b"".join(parts)

    @property
    def text(self) -> bytes:
        return self.body(False)

    @property
    def openmetrics(self) -> bytes:
        return self.body(True)


class _SourceLines:
    """The sample lines of the per-group families fed by one source mapping of the pass,
    kept from pass to pass: a group's lines are rendered again only when one of its values
    changed, and a family's block is joined again only when one of its lines did."""

    def __init__(self, families: tuple[GroupFamily, ...]):
        self.families = families
        self.row = _row_getter(families[0].source, tuple(f.field for f in families))
        self.rows: dict[Group, tuple] = {}  # each group's values, one per family
        self.position: dict[Group, int] = {}  # in the page's order
        self.lines: list[list[bytes]] = [[] for _ in families]  # per family, per group
        self.blocks: list[bytes] = [b"" for _ in families]

    def update(self, mapping: Mapping[Group, object]) -> list[bytes]:
        """Each family's block of sample lines for this pass's mapping."""
        row = self.row
        rows = {group: row(data) for group, data in mapping.items()}
        if rows == self.rows:
            return self.blocks
        families, before = self.families, self.rows
        if rows.keys() == before.keys():  # the same groups: only changed lines anew
            touched: set[int] = set()
            for group, values in rows.items():
                old = before[group]
                if old == values:
                    continue
                at = self.position[group]
                for index, value in enumerate(values):
                    if value != old[index]:
                        self.lines[index][at] = families[index].line(group, value)
                        touched.add(index)
            for index in touched:
                self.blocks[index] = b"".join(self.lines[index])
        else:  # groups came or went: every line in its place, unchanged ones kept
            order = _sorted(rows)
            old_lines, old_position = self.lines, self.position
            self.position = {group: i for i, group in enumerate(order)}
            self.lines = []
            known = [
                (group, rows[group], before.get(group), old_position.get(group)) for group in order
            ]
            for index, family in enumerate(families):
                column = old_lines[index]
                lines = [
                    # (`at` is None only where `old` is: `position` and `rows` had the
                    # same groups; the checker cannot tie them)
                    column[at]  # type: ignore[index]
                    if old is not None and old[index] == values[index]
                    else family.line(group, values[index])
                    for group, values, old, at in known
                ]
                self.lines.append(lines)
                self.blocks[index] = b"".join(lines)
        self.rows = rows
        return self.blocks


class PageRenderer:
    """Renders the page pass after pass, byte for byte what the tests' oracle
    (tests/pageoracle.py) renders whole for the same pass, reusing what did not change: a
    group's lines whose values are what they were, every family's HELP and TYPE lines, and
    nothing of a format until a scraper asks for it (`Page`). An idle pod costs a comparison of its
    values per pass, not a rendering."""

    def __init__(self, shapes: Shapes | None = None):
        families = group_families(shapes or Shapes())
        self._sources = {
            source: _SourceLines(tuple(f for f in families if f.source == source))
            for source in SOURCES
            if any(f.source == source for f in families)
        }
        self._order = [  # (source, index in it) of each per-group family, in page order
            (f.source, [g for g in families if g.source == f.source].index(f)) for f in families
        ]
        self._families = families
        # the sets' CPUs, one family for the node (with the cgroup fields, as the sets)
        self._cpuset_members: dict[str, tuple[int, ...]] | None = (
            {} if (shapes or Shapes()).cgroup else None
        )

    def render(
        self,
        intervals: Mapping[Group, Fields],
        totals: Mapping[Group, Mapping[str, int]],
        footprints: Mapping[Group, FootprintSums],
        state: SelfState,
        cgroup_intervals: Mapping[Group, CgroupFields] | None = None,
        cpusets: Mapping[Group, CpuSet] | None = None,
    ) -> Page:
        mappings = {
            "intervals": intervals,
            "cgroup_intervals": cgroup_intervals or {},
            "totals": totals,
            "footprints": footprints,
            "cpusets": cpusets or {},
        }
        blocks = {source: lines.update(mappings[source]) for source, lines in self._sources.items()}
        parts = [
            (family.name, family.kind, family.help, blocks[source][index])
            for family, (source, index) in zip(self._families, self._order, strict=True)
        ]
        if self._cpuset_members is not None:
            members = cpuset_members(cpusets or {}, self._cpuset_members)
            parts.append((members.name, members.kind, members.help, _sample_block(members)))
        parts += [(f.name, f.kind, f.help, _sample_block(f)) for f in _self_families(state)]
        return Page(tuple(parts))

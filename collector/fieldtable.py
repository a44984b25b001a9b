"""The interval fields (docs/reference.md §3), each written once: its name, unit, where it
is read from and where an exit record has it, how the guard treats it, its HELP text and
its column in `once`'s table. What is said of a field anywhere else is derived from this
table (the exposition's HELP, `once`'s columns, the thread fields an exit record closes,
the §3 table of the docs) or held to it by a unit test (`Fields`, whose order the positional
builds rely on; the guard's checks, `tests/unit/test_field_guards.py`).

How the guard treats a field is its kind (docs/reference.md §2):

- `Kind.THREAD`, a counter of each task (`/proc/<pid>/task/<tid>/…`), summed over the
  process's threads: each thread is guarded on its own (a thread whose counter fell adds
  nothing, its process's other threads still do); a thread born since the previous pass
  adds its counter whole; an exit record closes a thread's last interval with the record's
  final counter less the cached one, and counts a task born and gone whole.
- `Kind.PROCESS`, a counter of the process (`/proc/<pid>/stat`, its gone threads' included):
  a process whose counter fell adds nothing at all; a process born since the previous pass
  adds it whole; an exit record never closes it (the record's is the task's raw value, not
  the process's), except for a process born and gone between two passes, which no pass
  read: its tasks' records sum to it.
- `Kind.BOOKKEEPING`, made by the tracker, not read: the processes that contributed and the
  process-time observed, the denominator of every rate.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from collector.model import Fields

T = TypeVar("T")


class Kind(Enum):
    THREAD = "thread"
    PROCESS = "process"
    BOOKKEEPING = "bookkeeping"


@dataclass(frozen=True)
class Field:
    """One interval field. `reading`: the attribute of the reading it is taken from (a
    `ThreadReading`'s for a thread field, the same name on an `ExitRecord` and a `Fold`; a
    `ProcessReading`'s for a process field, in clock ticks where it ends so); `record`: the
    `ExitRecord` attribute, where an exit record has it; `taskstats`: that member of
    `struct taskstats` (include/uapi/linux/taskstats.h)."""

    name: str
    unit: str  # as docs/reference.md §3 says it: ns, count, bytes
    kind: Kind
    help: str  # the HELP text of its families (`/metrics`)
    meaning: str  # docs/reference.md §3's "meaning"
    source: str  # docs/reference.md §3's "source": the `/proc` file
    column: str  # `once`'s table
    reading: str | None = None
    record: str | None = None
    taskstats: str | None = None


FIELDS: tuple[Field, ...] = (
    Field(
        "processes", "count", Kind.BOOKKEEPING,
        "Processes that contributed a delta",
        "processes that contributed a delta", "",
        "PROCS",
    ),
    Field(
        "observed_nanos", "ns", Kind.BOOKKEEPING,
        "Process-time observed, the denominator of every rate (ns)",
        "process-time observed: Σ each contributing process's own interval (two processes "
        "watched a minute each = two minutes); the denominator of every rate",
        "reading instants",
        "OBSERVED",
    ),
    Field(
        "on_cpu_nanos", "ns", Kind.THREAD,
        "Time on a CPU, summed over threads (ns)",
        "time on a CPU", "Σ threads: `schedstat` field 1",
        "ON-CPU", "on_cpu_ns", "on_cpu_ns", "cpu_run_virtual_total",
    ),
    Field(
        "run_delay_nanos", "ns", Kind.THREAD,
        "Time runnable but waiting for a CPU, summed over threads (ns)",
        "time runnable but waiting for a CPU (a task held by its CPU quota waits here too, §7)",
        "Σ threads: `schedstat` field 2",
        "RUN-DELAY", "run_delay_ns", "run_delay_ns", "cpu_delay_total",
    ),
    Field(
        "cpu_user_nanos", "ns", Kind.PROCESS,
        "User CPU time (ns)",
        "user CPU time", "`stat` utime, ticks → ns",
        "USER", "utime_ticks", "utime_us", "ac_utime",
    ),
    Field(
        "cpu_system_nanos", "ns", Kind.PROCESS,
        "System CPU time (ns)",
        "system CPU time", "`stat` stime, ticks → ns",
        "SYSTEM", "stime_ticks", "stime_us", "ac_stime",
    ),
    Field(
        "major_faults", "count", Kind.PROCESS,
        "Major page faults",
        "major page faults", "`stat` majflt",
        "MAJFLT", "major_faults", "major_faults", "ac_majflt",
    ),
    Field(
        "voluntary_switches", "count", Kind.THREAD,
        "Voluntary context switches, summed over threads",
        "voluntary context switches", "Σ threads: `status`",
        "VOL-CS", "voluntary_switches", "voluntary_switches", "nvcsw",
    ),
    Field(
        "nonvoluntary_switches", "count", Kind.THREAD,
        "Involuntary context switches, summed over threads",
        "involuntary context switches", "Σ threads: `status`",
        "INVOL-CS", "nonvoluntary_switches", "nonvoluntary_switches", "nivcsw",
    ),
    Field(
        "read_bytes", "bytes", Kind.THREAD,
        "Bytes really fetched from storage, summed over threads",
        "bytes really fetched from storage (never `rchar`)", "Σ threads: `io`",
        "READ", "read_bytes", "read_bytes", "read_bytes",
    ),
    Field(
        "write_bytes", "bytes", Kind.THREAD,
        "Bytes really sent to storage, summed over threads",
        "bytes really sent to storage (never `wchar`)", "Σ threads: `io`",
        "WRITE", "write_bytes", "write_bytes", "write_bytes",
    ),
)  # fmt: skip
"""In `Fields`' order (docs/reference.md §3's)."""

THREAD_FIELDS = tuple(field for field in FIELDS if field.kind is Kind.THREAD)
PROCESS_FIELDS = tuple(field for field in FIELDS if field.kind is Kind.PROCESS)

HELP = {field.name: field.help for field in FIELDS}
COLUMNS: tuple[tuple[str, str], ...] = tuple((field.column, field.name) for field in FIELDS)
"""`once`'s table: each field's column title, in order."""

THREAD_ATTRIBUTES = tuple(field.reading or field.name for field in THREAD_FIELDS)
"""The thread counters' attribute names: a `ThreadReading`'s, an `ExitRecord`'s, a `Fold`'s."""
thread_counters = operator.attrgetter(*THREAD_ATTRIBUTES)
"""A task's thread counters, in the table's order: of a `ThreadReading`, an `ExitRecord`
or a `Fold` (the same attribute on each)."""


def process_record_counters(source: object) -> dict[str, int]:
    """The process counters of an `ExitRecord` or of the tasks a `Fold` holds, by their
    record attribute (`Tracker.pend`'s keywords)."""
    return {field.record: getattr(source, field.record) for field in PROCESS_FIELDS if field.record}


def _written_out(name: str, arguments: str, body: str, doc: str) -> Callable:
    """A function whose body is generated from the table, as the standard library's
    `namedtuple` and `dataclass` write their methods: each attribute named in the code, so
    it costs what the hand-written one did (a pass closes hundreds of records with these;
    building `Fields` from a mapping costs a third more). The table is this module's own
    constant: nothing from outside reaches the code."""
    namespace: dict[str, object] = {"Fields": Fields}
    exec(f"def {name}({arguments}):\n    return {body}\n", namespace)
    function = namespace[name]
    assert callable(function)
    function.__doc__ = doc
    function.__module__ = __name__
    return function


thread_fields: Callable[[object], Fields] = _written_out(
    "thread_fields", "source",
    "Fields(" + ", ".join(f"{f.name}=source.{f.reading}" for f in THREAD_FIELDS) + ")",
    "The thread fields of a task (an `ExitRecord`) or of the tasks a `Fold` holds, whole.",
)  # fmt: skip
thread_delta: Callable[[Sequence[int]], Fields] = _written_out(
    "thread_delta", "values",
    "Fields(" + ", ".join(f"{f.name}=values[{i}]" for i, f in enumerate(THREAD_FIELDS)) + ")",
    "`Fields` of thread counters given in the table's order; every other field 0.",
)  # fmt: skip
final_counters: Callable[[T, object], T] = _written_out(
    "final_counters", "thread, record",
    "thread._replace(" + ", ".join(f"{a}=record.{a}" for a in THREAD_ATTRIBUTES) + ")",
    "A `ThreadReading` with a record's thread counters (its final ones).",
)  # fmt: skip


def markdown_table() -> str:
    """docs/reference.md §3's table, as the docs hold it (`tests/unit/test_fieldtable.py`;
    `python -m tests.tools.fieldsdoc` writes it there)."""
    lines = [
        "| field | unit | meaning | source | exit record |",
        "| --- | --- | --- | --- | --- |",
    ]
    for field in FIELDS:
        exit_record = f"`{field.taskstats}`" if field.taskstats else ""
        cells = (f"`{field.name}`", field.unit, field.meaning, field.source, exit_record)
        lines.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(lines) + "\n"

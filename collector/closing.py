"""An exit record against the readings the guard holds (`Tracker.close`,
docs/reference.md §2, "Exits, where the kernel reports them"): whether a reading is of the
record's task, by start time; a thread's last interval, its final counters less the cached
ones; a task born and gone, counted whole; what a record adds to a pass. Pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import sub
from typing import NamedTuple

from collector.exits import ExitRecord
from collector.fieldtable import thread_counters, thread_delta, thread_fields
from collector.model import Fields, ProcessReading, ThreadReading, ticks_to_ns


class ExitDelta(NamedTuple):
    """What one exit record adds to a pass: `fields`, into the group of `process` (its
    cached reading, whose cgroup names it) or, for a task the cache never held (`process`
    None: born and gone between two passes), of its parent `ppid`."""

    record: ExitRecord
    fields: Fields
    process: ProcessReading | None
    ppid: int


@dataclass(slots=True)
class Closed:
    """The outcome of the exit records given to `Tracker.close`: the deltas, and how many
    records came to each end (`EXIT_OUTCOMES`)."""

    deltas: list[ExitDelta] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)


START_TOLERANCE_NS = 2 * 10**9
"""The longest a record may have waited in the socket (`ExitRecord.waited_ns`, the
listener's own bound) and still be matched to a task: its start is known to no better.
One that may have waited longer closes nothing (`late`)."""

SUSPEND_SLACK_NS = 10**8
"""Less growth than this in the time the machine was suspended (`Tracker.close`) is not a
suspend but the two clocks read apart (µs, or a preemption between the two reads): a
suspend and resume takes seconds."""


def started_as(
    start_ticks: int, record: ExitRecord, of_group: bool, hz: int, asleep_ns: int = 0
) -> bool:
    """Whether a task that started at `start_ticks` (clock ticks since boot, `/proc`'s,
    rounded down) is the one an exit record says started at its `start_ns` (or its
    process's, `of_group`): the record's arrival less the time the task lived (µs, rounded
    down), never before the task's start, and later by as long as the record waited in the
    socket, at most its `waited_ns`. So the task's start lies from `start_ns - waited_ns` to
    `start_ns`, and that span must meet the tick `start_ticks` names; earlier by
    `asleep_ns` too where the machine may have been suspended in the task's life."""
    start_ns = record.group_start_ns if of_group else record.start_ns
    low = ticks_to_ns(start_ticks, hz)
    earliest = start_ns - record.waited_ns - asleep_ns
    return low <= start_ns and earliest < ticks_to_ns(start_ticks + 1, hz)


READ = Fields()
"""`last_interval`'s answer for a task read at or after its exit (a zombie): nothing left."""


def last_interval(thread: ThreadReading, record: ExitRecord, read_alive: bool) -> Fields | None:
    """A thread's last interval: the record's final counters less its cached ones; `READ`
    where every cached counter is at or past the record's (a pass read it after its exit,
    as a zombie: its final schedule counts a switch and a few ns more), but for a task
    `read_alive` (before its exit) that did not move since (a sleeper killed): its last
    interval is nothing; None where some fell and some did not."""
    values = tuple(map(sub, thread_counters(record), thread_counters(thread)))
    if max(values) <= 0:
        return Fields() if read_alive and min(values) == 0 else READ
    if min(values) < 0:
        return None
    return thread_delta(values)


def whole(record: ExitRecord, process_fields: Pending | None) -> Fields:
    """A task born since the previous pass, counted whole: its thread fields; and, where
    its process was born since too and this is its last task (`process_fields`: the user
    and system time and major faults of its tasks gone before, `Tracker._pending`), the
    process's: those, its own, the process counted and its life observed (a process's
    `stat` is the sum of its tasks')."""
    fields = thread_fields(record)
    if process_fields is not None:
        fields.cpu_user_nanos = (record.utime_us + process_fields.utime_us) * 1000
        fields.cpu_system_nanos = (record.stime_us + process_fields.stime_us) * 1000
        fields.major_faults = record.major_faults + process_fields.major_faults
        fields.processes = 1
        fields.observed_nanos = record.group_lived_ns
    return fields


@dataclass(slots=True)
class Pending:
    """What the tasks of a process born since the last pass that are gone add to its user
    and system time and major faults, held until its last task's record (`whole`) or a
    pass's reading of the process, whose `stat` has them (then dropped)."""

    group_start_ns: int
    taken_at_pass: int
    utime_us: int = 0
    stime_us: int = 0
    major_faults: int = 0

"""The guard's properties, per field kind and tested for each field of the table
(collector/fieldtable.py): a counter that falls, a task born since, a continuing one, a
closed one. The fields come from the table, so a field added there is covered here with no
new test; a field the guard forgets fails here, not only in the kernel layer."""

from __future__ import annotations

import dataclasses

import pytest

from collector import fieldtable
from collector.exits import ExitRecord
from collector.fieldtable import PROCESS_FIELDS, THREAD_FIELDS, Field, process_record_counters
from collector.model import FIELD_NAMES, Fields
from collector.tracker import Tracker
from tests.exitrecords import START, record
from tests.readings import process_reading, thread_reading
from tests.unit.test_tracker import HZ, SEC, TICK_NS


def named(fields: list[Field]):
    return pytest.mark.parametrize("field", fields, ids=[f.name for f in fields])


def in_ns(field: Field, value: int, unit_of: str | None) -> int:
    """A field's value as the interval holds it, from a reading's or a record's: clock ticks
    and µs (the attribute's name says which) to ns."""
    assert unit_of is not None
    if unit_of.endswith("_ticks"):
        return value * TICK_NS
    if unit_of.endswith("_us"):
        return value * 1000
    return value


def only(field: Field, value: int, **bookkeeping: int) -> dict[str, int]:
    """An interval's fields where `field` alone moved by `value`."""
    expected = dict.fromkeys(FIELD_NAMES, 0)
    expected.update(bookkeeping)
    expected[field.name] = value
    return expected


def thread(tid: int, start: int, field: Field | None = None, value: int = 0):
    counters = {field.reading: value} if field is not None and field.reading else {}
    return thread_reading(tid=tid, start_ticks=start, **counters)


def process(pid, start, at, threads, field: Field | None = None, value: int = 0):
    counters = {field.reading: value} if field is not None and field.reading else {}
    return process_reading(pid=pid, start_ticks=start, at_ns=at, threads=threads, **counters)


def exit_record(field: Field, value: int, *args, **kwargs) -> ExitRecord:
    """`tests.exitrecords.record`, with the field's record attribute set to `value`."""
    assert field.record is not None
    return dataclasses.replace(record(*args, **kwargs), **{field.record: value})


def passes(*readings_of_each) -> tuple[Tracker, list]:
    """A tracker through one pass a 100 s (at 100 s, 200 s, ...), each of the readings given;
    and what each pass gave."""
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True  # as the engine's, listening for exits
    return tracker, [
        tracker.advance(list(readings), (k + 1) * 100 * SEC)
        for k, readings in enumerate(readings_of_each)
    ]


def test_the_kinds_cover_every_counter_and_name_real_attributes():
    """Every field but the bookkeeping is a thread or a process counter, read from an
    attribute a reading has and closed from one an exit record has."""
    from collector.exits import Fold
    from collector.model import ProcessReading, ThreadReading

    bookkeeping = {f.name for f in fieldtable.FIELDS if f.kind is fieldtable.Kind.BOOKKEEPING}
    assert bookkeeping == {"processes", "observed_nanos"}
    assert len(THREAD_FIELDS) + len(PROCESS_FIELDS) + len(bookkeeping) == len(FIELD_NAMES)
    records = {f.name for f in dataclasses.fields(ExitRecord)}
    for field in THREAD_FIELDS:
        assert field.reading in ThreadReading._fields and field.reading in Fold.__slots__
        assert field.record == field.reading and field.record in records
    for field in PROCESS_FIELDS:
        assert field.reading in ProcessReading._fields and field.record in records
        assert field.record in Fold.__slots__


# --- a thread counter ------------------------------------------------------------------


@named(THREAD_FIELDS)
def test_a_thread_counter_adds_its_delta_alone(field):
    """A thread read in two passes: the counter's delta, every other counter 0."""
    first = process(10, START, 100 * SEC, [thread(10, START, field, 10)])
    second = process(10, START, 200 * SEC, [thread(10, START, field, 25)])
    _, (_, outcome) = passes([first], [second])
    (delta,) = outcome.deltas
    assert delta.fields.as_dict() == only(field, 15, processes=1, observed_nanos=100 * SEC)


@named(THREAD_FIELDS)
def test_a_thread_whose_counter_fell_adds_nothing_and_its_siblings_still_do(field):
    first = process(
        10, START, 100 * SEC, [thread(10, START, field, 10), thread(11, START, field, 10)]
    )
    second = process(
        10, START, 200 * SEC, [thread(10, START, field, 5), thread(11, START, field, 12)]
    )
    _, (_, outcome) = passes([first], [second])
    (delta,) = outcome.deltas
    assert outcome.threads_refused == {"counter_fell": 1}
    assert delta.fields.as_dict() == only(field, 2, processes=1, observed_nanos=100 * SEC)


@named(THREAD_FIELDS)
def test_a_thread_born_since_the_previous_pass_adds_its_counter_whole(field):
    born = START + 150 * 100  # 150 s after START's, in ticks: after the pass at 100 s
    first = process(10, START, 100 * SEC, [thread(10, START)])
    second = process(10, START, 200 * SEC, [thread(10, START), thread(11, born, field, 40)])
    _, (_, outcome) = passes([first], [second])
    (delta,) = outcome.deltas
    assert delta.fields.as_dict() == only(field, 40, processes=1, observed_nanos=100 * SEC)


@named(THREAD_FIELDS)
def test_an_exit_record_closes_a_thread_counter_from_the_cached_one(field):
    read = process(10, START, 200 * SEC, [thread(10, START, field, 10)])
    tracker, _ = passes([read], [read])
    final = exit_record(field, 17, 10, at=230 * SEC, lived=230 * SEC - START * TICK_NS)
    closed = tracker.close([final])
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1}
    assert delta.fields.as_dict() == only(field, 7, observed_nanos=30 * SEC)


@named(THREAD_FIELDS)
def test_an_exit_record_whose_thread_counter_fell_closes_nothing(field):
    """Its other counters rose: the record is not a zombie's, and one of its counters is
    below the cached one."""
    others = {f.record: 5 for f in THREAD_FIELDS if f is not field}
    read = process(10, START, 200 * SEC, [thread(10, START, field, 10)])
    tracker, _ = passes([read], [read])
    final = dataclasses.replace(
        exit_record(field, 3, 10, at=230 * SEC, lived=230 * SEC - START * TICK_NS), **others
    )
    closed = tracker.close([final])
    assert closed.deltas == [] and closed.outcomes == {"counter_fell": 1}


@named(THREAD_FIELDS)
def test_a_thread_born_and_gone_between_passes_counts_its_counter_whole(field):
    read = process(10, START, 200 * SEC, [thread(10, START)])
    tracker, _ = passes([read], [read])
    gone = exit_record(
        field, 9, 55, 10, at=210 * SEC, lived=2 * SEC, last=False,
        group_lived=210 * SEC - START * TICK_NS,
    )  # fmt: skip
    closed = tracker.close([gone])
    (delta,) = closed.deltas
    assert closed.outcomes == {"born": 1}
    assert delta.fields.as_dict() == only(field, 9)


# --- a process counter -----------------------------------------------------------------


@named(PROCESS_FIELDS)
def test_a_process_counter_adds_its_delta_alone(field):
    first = process(10, START, 100 * SEC, [thread(10, START)], field, 10)
    second = process(10, START, 200 * SEC, [thread(10, START)], field, 25)
    _, (_, outcome) = passes([first], [second])
    (delta,) = outcome.deltas
    expected = in_ns(field, 15, field.reading)
    assert delta.fields.as_dict() == only(field, expected, processes=1, observed_nanos=100 * SEC)


@named(PROCESS_FIELDS)
def test_a_process_whose_counter_fell_adds_nothing_at_all(field):
    """Its threads' counters rose: the whole process is refused, not only the field."""
    first = process(10, START, 100 * SEC, [thread(10, START, THREAD_FIELDS[0], 1)], field, 10)
    second = process(10, START, 200 * SEC, [thread(10, START, THREAD_FIELDS[0], 9)], field, 5)
    _, (_, outcome) = passes([first], [second])
    assert outcome.deltas == [] and outcome.refused == {"counter_fell": 1}


@named(PROCESS_FIELDS)
def test_a_process_born_since_the_previous_pass_adds_its_counter_whole(field):
    born = START + 150 * 100
    first = process(10, START, 100 * SEC, [thread(10, START)])
    second = process(20, born, 200 * SEC, [thread(20, born)], field, 40)
    _, (_, outcome) = passes([first], [first, second])
    (delta,) = [d for d in outcome.deltas if d.reading.pid == 20]
    observed = 200 * SEC - born * TICK_NS
    expected = in_ns(field, 40, field.reading)
    assert delta.fields.as_dict() == only(field, expected, processes=1, observed_nanos=observed)


@named(PROCESS_FIELDS)
def test_an_exit_record_of_a_process_held_leaves_its_process_counter_alone(field):
    """The record's is the task's raw value, not the process's adjusted one: its last
    interval of this counter stays lost (docs/reference.md §2)."""
    read = process(10, START, 200 * SEC, [thread(10, START)], field, 10)
    tracker, _ = passes([read], [read])
    final = exit_record(field, 99, 10, at=230 * SEC, lived=230 * SEC - START * TICK_NS, on_cpu=1)
    closed = tracker.close([final])
    (delta,) = closed.deltas
    assert delta.fields.as_dict() == only(
        THREAD_FIELDS[0], 1, **{field.name: 0}, observed_nanos=30 * SEC
    )


@named(PROCESS_FIELDS)
def test_a_process_born_and_gone_counts_its_tasks_counters_summed(field):
    """No pass read it: its process counter is the sum of its tasks' records, the gone
    thread's and the last task's, whichever way they come."""
    tracker, _ = passes([], [])
    thread_gone = exit_record(
        field, 4, 78, 77, at=209 * SEC, lived=SEC, last=False, group_lived=4 * SEC
    )
    last = exit_record(field, 6, 77, at=210 * SEC, lived=5 * SEC)
    closed = tracker.close([thread_gone, last])
    assert closed.outcomes == {"born": 2}
    total = Fields()
    for delta in closed.deltas:
        total.add(delta.fields)
    assert total.as_dict() == only(
        field, in_ns(field, 10, field.record), processes=1, observed_nanos=5 * SEC
    )


@named(PROCESS_FIELDS)
def test_a_process_born_and_gone_counts_the_threads_folded_as_they_came(field):
    """Its threads no pass read were folded by the listener (`Fold`), their process counters
    pended by the engine (`Tracker.pend`, its keywords the table's record attributes); its
    last task's record adds its own."""
    tracker, _ = passes([], [])
    folded = dict.fromkeys(process_record_counters(record(1, at=SEC, lived=SEC)), 0)
    folded[field.record or ""] = 4
    tracker.pend(77, 205 * SEC, **folded)
    closed = tracker.close([exit_record(field, 6, 77, at=210 * SEC, lived=5 * SEC)])
    (delta,) = closed.deltas
    assert delta.fields.as_dict() == only(
        field, in_ns(field, 10, field.record), processes=1, observed_nanos=5 * SEC
    )

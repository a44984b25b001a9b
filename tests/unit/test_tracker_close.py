"""Exit records closed against the guard's cache (`Tracker.close`, collector/tracker.py): each
record's last interval, against the reading the cache holds or one the passes kept, never a
task counted twice in either order of record and read, a task no pass read counted whole
only where no pass could have, a reused PID never taken for the old task."""

from __future__ import annotations

import pytest

from collector.closing import START_TOLERANCE_NS, SUSPEND_SLACK_NS
from collector.model import Fields
from collector.tracker import MAX_KEPT_PASSES, Tracker
from tests.exitrecords import START, record
from tests.unit.test_tracker import HZ, SEC, TICK_NS, carry, proc, thread


def two_passes(*first: object, second=()) -> Tracker:
    """A tracker through two passes at 100 s and 200 s (the interval begins at 100 s)."""
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True  # as the engine's, listening for exits
    tracker.advance(list(first), 100 * SEC)
    tracker.advance(list(second), 200 * SEC)
    return tracker


def test_a_record_closes_the_last_interval_of_the_process_the_cache_holds():
    """A one-thread process read at 200 s exits at 230 s: its thread's counters less the
    cached ones, observed to the exit, and not counted as a process again (the pass that
    read it counted it in this interval); its user and system time not (the record's are
    raw, `/proc`'s adjusted)."""
    threads = [thread(10, START, cpu=3 * SEC, delay=SEC)]
    read = proc(10, START, at=200 * SEC, user=5, threads=threads)
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(10, at=230 * SEC, lived=230 * SEC - START * TICK_NS, on_cpu=4 * SEC,
                delay=3 * SEC, vol=9, rd=4096, utime_us=10**7)]
    )  # fmt: skip
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1}
    assert delta.process is tracker._cache[10] or delta.process == read
    fields = delta.fields
    assert (fields.on_cpu_nanos, fields.run_delay_nanos, fields.voluntary_switches) == (
        SEC, 2 * SEC, 9,
    )  # fmt: skip
    assert fields.read_bytes == 4096 and fields.cpu_user_nanos == 0
    assert (fields.processes, fields.observed_nanos) == (0, 30 * SEC)


def test_no_task_is_counted_twice_whichever_of_its_record_and_a_read_comes_first():
    """A zombie (exited, not yet reaped) is still in `/proc`, its counters final. Record
    first, then a pass reads the zombie: the pass adds nothing. A pass reads the zombie
    first, then the record: the record adds nothing."""
    alive = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=3 * SEC)])
    zombie = proc(10, START, at=300 * SEC, threads=[thread(10, START, cpu=4 * SEC)])
    final = record(10, at=250 * SEC, lived=250 * SEC - START * TICK_NS, on_cpu=4 * SEC)

    tracker = two_passes(alive, second=[alive])
    assert tracker.close([final]).deltas[0].fields.on_cpu_nanos == SEC
    later = tracker.advance([zombie], 300 * SEC)
    assert later.deltas == [] and not later.refused

    tracker = two_passes(alive, second=[alive])
    read = tracker.advance([zombie], 300 * SEC)
    assert [d.fields.on_cpu_nanos for d in read.deltas] == [SEC]
    # come a second after the read of its zombie, it may have waited that long
    after = tracker.close([record(10, at=301 * SEC, lived=301 * SEC - START * TICK_NS,
                                  waited=SEC + 1, on_cpu=4 * SEC)])  # fmt: skip
    assert after.deltas == [] and after.outcomes == {"read": 1}
    # and no later pass counts the zombie again
    assert tracker.advance([zombie], 400 * SEC).deltas == []


def test_a_zombie_read_past_its_record_is_read_not_a_counter_that_fell():
    """The kernel's last schedule of an exiting task comes after its record: a zombie read
    by a pass has a switch and some ns more than its record. Nothing is left to close, and
    nothing fell: `read`, never `counter_fell`."""
    alive = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=3 * SEC)])
    zombie = proc(10, START, at=300 * SEC, threads=[thread(10, START, cpu=4 * SEC + 5000)])
    tracker = two_passes(alive, second=[alive])
    tracker.advance([zombie], 300 * SEC)
    closed = tracker.close([record(10, at=301 * SEC, lived=301 * SEC - START * TICK_NS,
                                   on_cpu=4 * SEC)])  # fmt: skip
    assert closed.deltas == [] and closed.outcomes == {"read": 1}


def test_a_task_gone_before_the_pass_read_it_is_closed_against_its_last_reading():
    """Exited after the first pass read it, before the second did: the second pass drops it
    from the cache, and its record, taken after that pass, closes it all the same."""
    read = proc(10, START, at=100 * SEC, threads=[thread(10, START, cpu=3 * SEC)])
    tracker = two_passes(read, second=[])
    assert tracker.tracked_processes == 0
    closed = tracker.close([record(10, at=150 * SEC, lived=100 * SEC, on_cpu=5 * SEC)])
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1} and delta.fields.on_cpu_nanos == 2 * SEC
    assert (delta.fields.processes, delta.fields.observed_nanos) == (1, 50 * SEC)


def test_a_thread_of_a_live_process_closes_its_own_interval_only():
    """A worker thread of a process that lives on: its thread fields, not the process."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC),
                                                  thread(11, START + 10, cpu=SEC)])  # fmt: skip
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(11, 10, at=210 * SEC, lived=210 * SEC - (START + 10) * TICK_NS, last=False,
                group_lived=210 * SEC - START * TICK_NS, on_cpu=3 * SEC)]
    )  # fmt: skip
    (delta,) = closed.deltas
    assert delta.fields.on_cpu_nanos == 2 * SEC
    assert (delta.fields.processes, delta.fields.observed_nanos) == (0, 0)


def test_a_thread_gone_from_a_live_process_is_closed_against_its_last_reading():
    """Thread 11 read by the first pass, gone by the second, which reads its process on:
    its record, taken after the second pass, closes it from the first pass's reading, and
    is not taken for a birth (it was counted whole, or from its own earlier reading, by
    the pass that read it)."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC)]
    first = proc(10, START, at=100 * SEC, threads=both)
    second = proc(10, START, at=200 * SEC, threads=both[:1])
    tracker = two_passes(first, second=[second])
    closed = tracker.close(
        [record(11, 10, at=201 * SEC, lived=201 * SEC - (START + 10) * TICK_NS, last=False,
                group_lived=201 * SEC - START * TICK_NS, on_cpu=3 * SEC)]
    )  # fmt: skip
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1} and delta.fields.on_cpu_nanos == 2 * SEC
    assert delta.process is second


def test_a_task_born_and_gone_between_passes_counts_whole_in_its_parents_group():
    """A short process (not in the cache), started after the interval began (100 s):
    every counter of its record, its own user and system time too, its life observed."""
    tracker = two_passes(second=[])
    closed = tracker.close(
        [record(99, at=180 * SEC, lived=30 * 10**6, ppid=7, on_cpu=20 * 10**6,
                delay=5 * 10**6, utime_us=20_000, majflt=1)]
    )  # fmt: skip
    (delta,) = closed.deltas
    assert closed.outcomes == {"born": 1}
    assert delta.process is None and delta.ppid == 7
    fields = delta.fields
    assert (fields.on_cpu_nanos, fields.run_delay_nanos, fields.cpu_user_nanos) == (
        20 * 10**6, 5 * 10**6, 20 * 10**6,
    )  # fmt: skip
    assert (fields.processes, fields.observed_nanos, fields.major_faults) == (1, 30 * 10**6, 1)


def test_a_thread_born_and_gone_in_a_live_process_adds_its_thread_fields_only():
    """Its user time is in its process's stat from then on (a live process's takes its
    gone threads' in): counting it here would count it twice."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START)])
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(55, 10, at=210 * SEC, lived=2 * SEC, last=False,
                group_lived=210 * SEC - START * TICK_NS, on_cpu=SEC, utime_us=10**6)]
    )  # fmt: skip
    (delta,) = closed.deltas
    assert closed.outcomes == {"born": 1} and delta.process is not None
    assert (delta.fields.on_cpu_nanos, delta.fields.cpu_user_nanos) == (SEC, 0)


def test_a_record_of_a_task_older_than_the_interval_that_no_pass_read_closes_nothing():
    tracker = two_passes(second=[])
    closed = tracker.close([record(99, at=180 * SEC, lived=150 * SEC, on_cpu=SEC)])
    assert closed.deltas == [] and closed.outcomes == {"unmatched": 1}


def test_a_task_begun_before_the_first_pass_listed_is_not_counted_whole():
    """The first pass listed `/proc` from 100 s and had read every process by 101 s. Records
    come at 101.5 s: a task begun at 99.5 s may have run before there was a tracker, and
    closes nothing; one begun at 100.5 s, which the pass did not read, is new, counted
    whole; one begun at 100.3 s that the pass read at 100.6 s is closed from that reading,
    not counted whole (a task the first pass read is in a reading kept)."""
    start = 10_030  # 100.3 s, in ticks
    assert start * TICK_NS == 100_300_000_000
    read = proc(50, start, at=100_600_000_000, threads=[thread(50, start, cpu=SEC // 10)])
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    tracker.advance([read], 100 * SEC, read_until_ns=101 * SEC)
    at = 101_500_000_000
    old = record(99, at=at, lived=2 * SEC, on_cpu=SEC)
    new = record(98, at=at, lived=SEC, waited=SEC // 8, on_cpu=SEC // 8)
    gone = record(50, at=at, lived=at - start * TICK_NS, on_cpu=SEC // 5)
    closed = tracker.close([old, new, gone])
    assert closed.outcomes == {"unmatched": 1, "born": 1, "closed": 1}
    on_cpu = {d.record.pid: d.fields.on_cpu_nanos for d in closed.deltas}
    assert on_cpu == {98: SEC // 8, 50: SEC // 10}
    # begun within its wait of the listing: it may have begun before, and counts nothing
    edge = record(97, at=at, lived=SEC + SEC // 2 - SEC // 10, waited=SEC // 5, on_cpu=SEC)
    assert tracker.close([edge]).outcomes == {"unmatched": 1}


def test_a_thread_alive_after_its_process_was_read_and_not_in_that_reading_is_new():
    """Process 50, read by the first pass (listing from 100 s, every process read by
    100.9 s) with its one thread. Thread 51's record comes at 101.5 s; it lived 1.2 s and
    may have waited 0.5 s, so it may have begun at 99.8 s, before the first pass: yet it
    was alive after 101 s, after the pass had listed its process's tasks, and not among
    them. It began after that listing, and no pass read it: counted whole. A thread that
    may have exited by 100.9 s (its record then may be of a task that lived before the
    pass), or of a process no pass read, closes nothing."""
    start = 10_000  # 100 s, in ticks
    read = proc(50, start, at=100_200_000_000, threads=[thread(50, start, cpu=SEC // 10)])
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    tracker.advance([read], 100 * SEC, read_until_ns=100_900_000_000)
    at = 101_500_000_000
    group_lived = at - start * TICK_NS

    def of(pid: int, tgid: int, waited: int) -> object:
        return record(pid, tgid, at=at, lived=1_200_000_000, waited=waited, last=False,
                      group_lived=group_lived, on_cpu=SEC // 4)  # fmt: skip

    closed = tracker.close([of(51, 50, SEC // 2)])
    assert closed.outcomes == {"born": 1}
    assert [d.fields.on_cpu_nanos for d in closed.deltas] == [SEC // 4]
    # may have exited (at 101.5 s less 0.7 s) before the pass had read every process
    assert tracker.close([of(52, 50, 7 * SEC // 10)]).outcomes == {"unmatched": 1}
    # of a process no pass read
    assert tracker.close([of(61, 60, SEC // 2)]).outcomes == {"unmatched": 1}
    # taken after a second pass read the process again with every task it had: thread 53
    # was in neither reading, and alive after the first
    again = proc(50, start, at=200 * SEC, threads=[thread(50, start, cpu=SEC // 5)])
    tracker.advance([again], 200 * SEC, read_until_ns=201 * SEC)
    assert tracker.close([of(53, 50, SEC // 2)]).outcomes == {"born": 1}
    # a third pass reads it without the thread the first read: each reading since holds
    # no task of the one before, now, from that pass's end on
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    two = [thread(50, start, cpu=SEC // 10), thread(54, start, cpu=SEC // 10)]
    tracker.advance([proc(50, start, at=100_200_000_000, threads=two)], 100 * SEC,
                    read_until_ns=100_900_000_000)  # fmt: skip
    tracker.advance([again], 200 * SEC, read_until_ns=201 * SEC)
    assert tracker.close([of(55, 50, SEC // 2)]).outcomes == {"unmatched": 1}


def test_a_reused_pid_is_not_the_task_the_cache_holds():
    """PID 10 cached for a process read alive at 200 s; the record is of a task started at
    205 s under the same PID (born since the interval began, after the cached one was
    read): counted whole, the cached task left alone."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=3 * SEC)])
    tracker = two_passes(read, second=[read])
    closed = tracker.close([record(10, at=210 * SEC, lived=5 * SEC, on_cpu=SEC)])
    assert closed.outcomes == {"born": 1}
    assert closed.deltas[0].process is None and closed.deltas[0].fields.on_cpu_nanos == SEC
    assert tracker._cache[10].threads[0].on_cpu_ns == 3 * SEC


def passes_every(seconds: int, *passes: list, keeps: bool = True) -> Tracker:
    """A tracker through one pass every `seconds` s from `seconds` s, each given its
    processes, read for a second after its listing."""
    tracker = Tracker(HZ)
    tracker.keeps_replaced = keeps
    for n, readings in enumerate(passes, 1):
        tracker.advance(list(readings), n * seconds * SEC, read_until_ns=(n * seconds + 1) * SEC)
    return tracker


def test_a_task_born_just_after_the_interval_began_counts_whole_however_long_it_waited():
    """Passes at 100, 200 and 300 s: the records taken after the third are of the
    interval begun at 200 s. A task born at 200.05 s, gone at 200.2 s, its record read at
    200.3 s by a listener that last found the socket empty at 199.9 s (it may have waited
    0.4 s, and so began as early as 199.65 s): read by no pass (what they left is kept),
    it counts whole, in its parent's group."""
    started, gone, read_at = 200_050_000_000, 200_200_000_000, 200_300_000_000
    other = proc(20, START, at=100 * SEC)
    tracker = passes_every(100, [other], [], [])
    born = record(77, at=read_at, lived=gone - started, waited=400_000_000, ppid=5,
                  on_cpu=10**8)  # fmt: skip
    closed = tracker.close([born])
    assert closed.outcomes == {"born": 1}
    assert closed.deltas[0].fields.on_cpu_nanos == 10**8 and closed.deltas[0].ppid == 5


def test_a_thread_gone_two_passes_before_its_record_is_closed_against_its_last_reading():
    """Thread 11 read at 100 s, gone by 200 s; its record, kept waiting in the socket
    past the pass at 200 s, comes before the one at 201.5 s: closed against the reading
    of 100 s, not counted whole, nor lost."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC)]
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    tracker.advance([proc(10, START, at=100 * SEC, threads=both)], 100 * SEC,
                    read_until_ns=100 * SEC)  # fmt: skip
    tracker.advance([proc(10, START, at=200 * SEC, threads=both[:1])], 200 * SEC,
                    read_until_ns=200 * SEC)  # fmt: skip
    tracker.advance([proc(10, START, at=int(201.5 * SEC), threads=both[:1])],
                    int(201.5 * SEC), read_until_ns=int(201.5 * SEC))  # fmt: skip
    waited = int(1.8 * SEC)
    closed = tracker.close(
        [record(11, 10, at=int(201.6 * SEC), lived=int(201.6 * SEC) - (START + 10) * TICK_NS,
                last=False, waited=waited, group_lived=int(201.6 * SEC) - START * TICK_NS,
                on_cpu=3 * SEC)]
    )  # fmt: skip
    assert closed.outcomes == {"closed": 1} and closed.deltas[0].fields.on_cpu_nanos == 2 * SEC


def test_a_process_a_pass_could_not_read_is_not_counted_whole_when_it_exits():
    """Read at 100 s, then unreadable to every pass (not in their readings): what the
    passes left of it goes once no record can need it. Its record at 450 s is of a task
    that began before the pass whose readings went ended: it may have been counted, and
    is not counted whole again."""
    read = proc(10, START, at=100 * SEC, threads=[thread(10, START, cpu=SEC)])
    tracker = passes_every(100, [read], [], [], [])
    assert tracker._forgotten_ns == 201 * SEC
    closed = tracker.close([record(10, at=450 * SEC, lived=450 * SEC - START * TICK_NS,
                                   on_cpu=9 * SEC)])  # fmt: skip
    assert closed.deltas == [] and closed.outcomes == {"unmatched": 1}


def test_what_passes_leave_for_records_is_what_a_record_may_still_close():
    """A pass keeps the readings it dropped, and those it replaced where a task is gone
    from the new one (or the PID is another process's): not those whose every task it
    read again. They are let go once a record of a task gone before them would be late,
    and past MAX_KEPT_PASSES passes."""

    steady = [thread(10, START, cpu=SEC), thread(11, START, cpu=SEC)]
    first = [proc(10, START, at=100 * SEC, threads=steady), proc(20, START, at=100 * SEC),
             proc(30, START, at=100 * SEC), proc(40, START, at=100 * SEC)]  # fmt: skip
    second = [proc(10, START, at=101 * SEC, threads=[*steady[:1], thread(12, START + 9)]),
              proc(20, START, at=101 * SEC), proc(40, START + 1, at=101 * SEC)]  # fmt: skip
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    tracker.advance(first, 100 * SEC, read_until_ns=100 * SEC)
    tracker.advance(second, 101 * SEC, read_until_ns=101 * SEC)
    (left,) = tracker._left
    assert sorted(left.readings) == [10, 30, 40]  # a task gone, the process gone, PID reused
    # a pass every 10 ms: those left go as their tasks' records would be late, or the most
    for n in range(2, 400):
        at = 101 * SEC + n * 10**7
        tracker.advance([proc(50 + n % 2, START, at=at)], at, read_until_ns=at)
        assert len(tracker._left) <= MAX_KEPT_PASSES
    assert tracker._forgotten_ns > 101 * SEC
    # a pass every 10 s: the two last
    for n in range(1, 5):
        at = 200 * SEC + n * 10 * SEC
        tracker.advance([proc(60 + n % 2, START, at=at)], at, read_until_ns=at)
    assert [left.read_until_ns for left in tracker._left] == [230 * SEC, 240 * SEC]


def test_a_sleeper_killed_after_a_pass_read_it_closes_its_process():
    """Asleep since a pass read it at 200 s, killed at 250 s: its record's counters are
    the ones read (it did not run since). Read alive, before its exit: its process's
    interval closes, empty but for the process and its time observed, not taken for a
    zombie read past its record."""
    asleep = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC, vol=5)])
    tracker = two_passes(asleep, second=[asleep])
    closed = tracker.close([record(10, at=250 * SEC, lived=250 * SEC - START * TICK_NS,
                                   waited=SEC, on_cpu=SEC, vol=5)])  # fmt: skip
    assert closed.outcomes == {"closed": 1}
    fields = closed.deltas[0].fields
    assert (fields.on_cpu_nanos, fields.voluntary_switches) == (0, 0)
    assert (fields.processes, fields.observed_nanos) == (0, 50 * SEC)


MS = 10**6


def tracker_for_exits() -> Tracker:
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    return tracker


def test_a_thread_gone_is_closed_against_the_newest_reading_left_not_an_older_one():
    """Threads 11 and 12 read at 100 s; 11 gone by 200 s (the pass leaves the
    reading of 100 s), 12 read at 200 s and gone by 300 s (that pass leaves the reading of
    200 s). 12's record closes from 200 s: the pass at 200 s took its delta from 100 s."""
    t10, t11, t12 = (
        thread(10, START),
        thread(11, START + 1, cpu=SEC),
        thread(12, START + 2, cpu=SEC),
    )
    tracker = tracker_for_exits()
    tracker.advance([proc(10, START, at=100 * SEC, threads=[t10, t11, t12])], 100 * SEC)
    second = tracker.advance(
        [proc(10, START, at=200 * SEC, threads=[t10, thread(12, START + 2, cpu=2 * SEC)])],
        200 * SEC,
    )
    assert second.deltas[0].fields.on_cpu_nanos == SEC  # 12's 100 s -> 200 s
    tracker.advance([proc(10, START, at=300 * SEC, threads=[t10])], 300 * SEC)
    closed = tracker.close(
        [
            record(
                12,
                10,
                at=301 * SEC,
                lived=301 * SEC - (START + 2) * TICK_NS,
                last=False,
                group_lived=301 * SEC - START * TICK_NS,
                on_cpu=3 * SEC,
            )
        ]
    )
    assert closed.outcomes == {"closed": 1}
    assert closed.deltas[0].fields.on_cpu_nanos == SEC  # not 2 s: 100 s -> 200 s counted


def one_second_passes(first_threads, gone_threads, n, at0=100):
    """Passes every second from `at0` s, read for 0 s; process 10 has `first_threads` at
    the first pass and `gone_threads` after; every pass also drops a short process (so
    every pass leaves something)."""
    tracker = tracker_for_exits()
    for k in range(n):
        at = (at0 + k) * SEC
        threads = first_threads if k == 0 else gone_threads
        tracker.advance(
            [proc(10, START, at=at, threads=threads), proc(50 + k % 2, START, at=at)],
            at,
            read_until_ns=at,
        )
    return tracker


def test_a_record_not_yet_late_closes_a_thread_gone_three_short_passes_before():
    """Passes every second (100..103 s), each leaving something. Thread
    11 read at 100 s, gone by 101 s (exited at 100.9 s); its record, read at 102.8 s, may
    have waited 1.95 s (within START_TOLERANCE_NS): it closes from the reading of 100 s."""
    both = [thread(10, START), thread(11, START + 1, cpu=SEC)]
    tracker = one_second_passes(both, both[:1], 4)
    closed = tracker.close(
        [
            record(
                11,
                10,
                at=int(102.8 * SEC),
                lived=int(100.9 * SEC) - (START + 1) * TICK_NS,
                waited=int(1.95 * SEC),
                last=False,
                group_lived=int(100.9 * SEC) - START * TICK_NS,
                on_cpu=2 * SEC,
            )
        ]
    )
    assert closed.outcomes == {"closed": 1}
    assert closed.deltas[0].fields.on_cpu_nanos == SEC


def test_a_waited_record_of_a_task_read_by_a_pass_whose_leftovers_went_is_not_counted_whole():
    """Passes every 10 ms from 99.9 s, each leaving something: the
    readings left go past MAX_KEPT_PASSES, long before a record is late. Task 77, born at
    99.95 s, counted whole by the pass at 100 s (1 ms), exits at 100.005 s; its record,
    read at 101 s, may have waited 1 s. Its last reading went: unmatched (lost), never
    counted whole again (its start, less the wait, is before the pass that read it)."""
    tracker = tracker_for_exits()
    start = 9995  # 99.95 s
    t = 99_900 * MS
    tracker.advance([proc(50, START, at=t)], t, read_until_ns=t)
    t = 100_000 * MS
    first = tracker.advance(
        [proc(77, start, at=t, threads=[thread(77, start, cpu=MS)])], t, read_until_ns=t
    )
    assert [d.fields.on_cpu_nanos for d in first.deltas] == [MS]
    n = 1
    while t < 101_000 * MS:
        t += 10 * MS
        tracker.advance([proc(50 + n % 2, START, at=t)], t, read_until_ns=t)
        n += 1
    assert all(77 not in left.readings for left in tracker._left)  # gone past the bound
    closed = tracker.close([record(77, at=101_000 * MS, lived=55 * MS, waited=SEC, on_cpu=2 * MS)])
    assert closed.outcomes == {"unmatched": 1}


def test_a_process_whose_idle_threads_are_the_very_readings_is_not_kept_as_left():
    """The incremental reader gives an idle thread's very reading again, in a
    new tuple beside a thread that ran: no task is gone, nothing is left for a record."""
    idle, busy = thread(10, START), thread(11, START, cpu=SEC)
    tracker = tracker_for_exits()
    tracker.advance([proc(10, START, at=100 * SEC, threads=[idle, busy])], 100 * SEC)
    tracker.advance(
        [
            proc(10, START, at=200 * SEC, threads=[idle, thread(11, START, cpu=2 * SEC)]),
        ],
        200 * SEC,
    )
    assert all(10 not in left.readings for left in tracker._left)


def test_without_read_until_a_pass_read_until_its_latest_reading():
    """A pass listed at 100 s whose last reading is at 101.5 s read until then:
    a thread gone from it is kept until a record of a task gone by 101.5 s would be late.
    Passes at 102.5 s and 103 s; the record, read at 103.2 s, may have waited 1.85 s."""
    both = [thread(10, START), thread(11, START + 1, cpu=SEC)]
    tracker = tracker_for_exits()
    tracker.advance([proc(10, START, at=99 * SEC, threads=both)], 99 * SEC)
    tracker.advance(
        [proc(20, START, at=100 * SEC), proc(10, START, at=int(101.5 * SEC), threads=both[:1])],
        100 * SEC,
    )
    for at in (int(102.5 * SEC), 103 * SEC):
        tracker.advance([proc(10, START, at=at, threads=both[:1])], at)
    closed = tracker.close(
        [
            record(
                11,
                10,
                at=int(103.2 * SEC),
                lived=int(101.4 * SEC) - (START + 1) * TICK_NS,
                waited=int(1.85 * SEC),
                last=False,
                group_lived=int(101.4 * SEC) - START * TICK_NS,
                on_cpu=2 * SEC,
            )
        ]
    )
    assert closed.outcomes == {"closed": 1}


def test_a_record_whose_earliest_start_is_the_forgotten_end_is_not_counted_whole():
    """earliest start == _forgotten_ns (the first pass's listing, at the start)."""
    tracker = Tracker(HZ)
    tracker.advance([], 100 * SEC, read_until_ns=101 * SEC)
    closed = tracker.close([record(98, at=102 * SEC, lived=3 * SEC // 2, waited=SEC // 2)])
    assert closed.outcomes == {"unmatched": 1}


def test_a_task_that_lived_across_a_suspend_is_not_counted_whole_again():
    """reference.md §2: 'a task that lived across a suspend has a derived start later than
    its own and goes `unmatched`'. Process 10 born at 110 s, counted whole by the pass at
    115 s, read again at 3716 s after a suspend of 3600 s (CLOCK_BOOTTIME runs on,
    ac_etime's monotonic clock does not), exits at 3720 s, gone from the pass at 3731 s.
    Its record's derived start is 3710 s, not 110 s: it must not be counted whole."""
    start = 110 * SEC // TICK_NS
    tracker = tracker_for_exits()
    tracker.advance([], 100 * SEC)
    born = tracker.advance(
        [proc(10, start, at=115 * SEC, user=10, threads=[thread(10, start, cpu=SEC)])], 115 * SEC
    )
    assert [d.born for d in born.deltas] == [True]
    asleep = 3600 * SEC  # CLOCK_BOOTTIME less CLOCK_MONOTONIC grew by the suspend
    tracker.advance(
        [proc(10, start, at=3716 * SEC, user=20, threads=[thread(10, start, cpu=2 * SEC)])],
        3716 * SEC,
        slept_ns=asleep,
    )
    tracker.advance([], 3731 * SEC, slept_ns=asleep)
    closed = tracker.close(
        [
            record(
                10,
                at=3720 * SEC + MS,
                lived=10 * SEC,
                waited=MS,
                on_cpu=int(2.5 * SEC),
                utime_us=250_000,
            )
        ],
        slept_ns=asleep,
    )
    assert closed.outcomes == {"unmatched": 1}, (closed.outcomes, closed.deltas)


def test_a_threads_record_after_its_last_tasks_still_closes_when_a_pass_read_the_zombie():
    """Thread 11 exits at 200.5 s, then the leader, the last task; the
    leader's record comes first (thread 11 was preempted between leaving its thread group
    and sending its record) and closes the process. The pass at 215 s reads the zombie
    (the leader alone); thread 11's record, read at 200.7 s, comes after it: it still
    closes from the reading of 200 s."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 1, cpu=SEC)]
    tracker = tracker_for_exits()
    tracker.advance([proc(10, START, at=100 * SEC, threads=both)], 100 * SEC)
    tracker.advance([proc(10, START, at=200 * SEC, threads=both)], 200 * SEC)
    leader = tracker.close(
        [
            record(
                10,
                10,
                at=int(200.6 * SEC),
                lived=int(200.5 * SEC) - START * TICK_NS,
                waited=SEC // 5,
                on_cpu=2 * SEC,
            )
        ]
    )
    assert leader.outcomes == {"closed": 1}
    zombie = tracker.advance(
        [proc(10, START, at=215 * SEC, threads=[thread(10, START, cpu=2 * SEC)])], 215 * SEC
    )
    assert zombie.deltas == []
    closed = tracker.close(
        [
            record(
                11,
                10,
                at=int(200.7 * SEC),
                lived=int(200.5 * SEC) - (START + 1) * TICK_NS,
                last=False,
                waited=SEC // 4,
                group_lived=int(200.5 * SEC) - START * TICK_NS,
                on_cpu=3 * SEC,
            )
        ]
    )
    assert closed.outcomes == {"closed": 1} and closed.deltas[0].fields.on_cpu_nanos == 2 * SEC


@pytest.mark.parametrize(("waited", "outcome"), [(1_500_000_000, "closed"), (3 * SEC, "late")])
def test_a_record_that_may_have_waited_past_the_tolerance_closes_nothing(waited, outcome):
    """The held task's own record, 1.5 s or 3 s late, as long as the listener says it may
    have waited: within START_TOLERANCE_NS it is matched; past it, it closes nothing
    (`late`) rather than be taken for another task's, or for a birth."""
    assert 1_500_000_000 < START_TOLERANCE_NS < 3 * SEC
    start = 170 * SEC // TICK_NS
    read = proc(10, start, at=200 * SEC, threads=[thread(10, start, cpu=3 * SEC)])
    tracker = two_passes(read, second=[read])
    closed = tracker.close([record(10, at=210 * SEC + waited, lived=40 * SEC, waited=waited,
                                   on_cpu=4 * SEC)])  # fmt: skip
    assert closed.outcomes == {outcome: 1}


def test_a_counter_below_the_cached_one_closes_nothing():
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=3 * SEC, delay=SEC)])
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(10, at=210 * SEC, lived=210 * SEC - START * TICK_NS, on_cpu=4 * SEC, delay=0)]
    )
    assert closed.deltas == [] and closed.outcomes == {"counter_fell": 1}


@pytest.mark.parametrize(
    ("late", "waited", "matched"),
    [
        (0, 0, True),
        (TICK_NS - 1000, 0, True),  # within the tick the start was rounded down to
        (TICK_NS, 0, False),  # the next tick: another task's
        (TICK_NS + SEC, SEC + 1000, True),  # a second late, and it may have waited that long
        (TICK_NS + SEC, SEC, False),  # a second late, and it waited less: another task's
        (-1000, 0, False),  # a µs before the task began: not this task
    ],
)
def test_a_record_matches_its_task_to_the_tick_and_the_time_it_may_have_waited(
    late, waited, matched
):
    """A record's start is its arrival less the time it lived (µs, rounded down): never
    before the task's start, later by as long as it waited in the socket, which the
    listener bounds (`waited_ns`); `/proc`'s start is rounded down to the tick (10 ms). The
    task's start must lie in both."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC)])
    tracker = two_passes(read, second=[read])
    start = START * TICK_NS + late
    closed = tracker.close(
        [record(10, at=210 * SEC, lived=210 * SEC - start, waited=waited, on_cpu=2 * SEC)]
    )
    assert (closed.outcomes.get("closed", 0) == 1) is matched


def test_a_carried_process_gone_is_observed_from_its_carried_instant():
    """Read at 200 s, carried at 300 s (its cgroup did not run: observed to 300 s then),
    gone at 400 s, its record at 350 s: observed from 300 s, not again from 200 s."""
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    p100 = proc(10, START, at=100 * SEC, threads=[thread(10, START, cpu=SEC)])
    p200 = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=2 * SEC)])
    tracker.advance([p100], 100 * SEC)
    tracker.advance([p200], 200 * SEC)
    tracker.advance([], 300 * SEC, carry(p200), carried_at_ns=300 * SEC)
    tracker.advance([], 400 * SEC)
    closed = tracker.close([record(10, at=350 * SEC, lived=350 * SEC - START * TICK_NS,
                                   on_cpu=3 * SEC)])  # fmt: skip
    assert closed.deltas[0].fields.observed_nanos == 50 * SEC


def test_a_late_record_of_a_task_read_just_after_its_start_is_not_a_birth():
    """Started half a second before the pass read it (counted whole by the birth rule), its
    record may have waited 1.5 s: its start matches the held task's, whose interval it
    closes, and it does not pass for a reused PID's newborn, counted whole again."""
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    start = int(199.5 * SEC) // TICK_NS
    tracker.advance([], 100 * SEC)
    tracker.advance([proc(10, start, at=200 * SEC, threads=[thread(10, start, cpu=SEC // 2)])],
                    200 * SEC)  # fmt: skip
    closed = tracker.close([record(10, at=202_500_000_000, lived=int(1.5 * SEC),
                                   waited=int(1.5 * SEC), on_cpu=SEC)])  # fmt: skip
    assert closed.outcomes == {"closed": 1}
    assert closed.deltas[0].fields.on_cpu_nanos == SEC // 2


def test_a_new_process_whose_threads_exit_before_it_is_read_has_their_time_once():
    """A process born just after a pass listed `/proc` (200 s): a worker thread exits
    before any pass reads the process. Its thread fields count with its record; its user
    time does not, since the pass that reads the process takes its `stat`, which has the
    thread's, whole (the birth rule)."""
    tracker = two_passes(second=[])
    worker = record(91, 90, at=201 * SEC, lived=SEC // 2, group_lived=SEC // 2 + SEC // 10,
                    last=False, on_cpu=SEC // 4, utime_us=250_000)  # fmt: skip
    (delta,) = tracker.close([worker]).deltas
    assert (delta.fields.on_cpu_nanos, delta.fields.cpu_user_nanos) == (SEC // 4, 0)
    assert delta.fields.processes == 0
    start = 200_400_000_000 // TICK_NS
    read = tracker.advance([proc(90, start, at=300 * SEC, user=30,
                                 threads=[thread(90, start, cpu=SEC)])], 300 * SEC)  # fmt: skip
    assert [d.fields.cpu_user_nanos for d in read.deltas] == [30 * TICK_NS]  # whole, once
    assert tracker._pending == {}


def test_a_new_process_gone_before_any_pass_has_its_tasks_times_and_one_life():
    """A process born and gone between two passes, two tasks: one process, its life
    observed, its user and system time the sum of its tasks'."""
    tracker = two_passes(second=[])
    leader = record(90, 90, at=180 * SEC, lived=30 * 10**6, group_lived=30 * 10**6, last=False,
                    on_cpu=10**6, utime_us=1000, stime_us=10)  # fmt: skip
    worker = record(91, 90, at=181 * SEC, lived=5 * 10**6, group_lived=1030 * 10**6,
                    last=True, on_cpu=10**6, utime_us=2000, stime_us=20, majflt=1)  # fmt: skip
    closed = tracker.close([leader, worker])
    total = Fields()
    for delta in closed.deltas:
        total.add(delta.fields)
    assert (total.processes, total.observed_nanos) == (1, 1030 * 10**6)
    assert (total.cpu_user_nanos, total.cpu_system_nanos) == (3_000_000, 30_000)
    assert (total.on_cpu_nanos, total.major_faults) == (2 * 10**6, 1)


def test_a_leader_gone_before_its_threads_adds_nothing_more_when_read_again():
    """The leader thread exits (its record closes it); the process lives on in its other
    thread, and the next pass reads the leader's last counters again: nothing more."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC)]
    tracker = two_passes(proc(10, START, at=200 * SEC, threads=both),
                         second=[proc(10, START, at=200 * SEC, threads=both)])  # fmt: skip
    closed = tracker.close([record(10, 10, at=210 * SEC, lived=210 * SEC - START * TICK_NS,
                                   last=False, on_cpu=3 * SEC, delay=SEC)])  # fmt: skip
    assert closed.deltas[0].fields.on_cpu_nanos == 2 * SEC
    later = tracker.advance([proc(10, START, at=300 * SEC, threads=[
        thread(10, START, cpu=3 * SEC, delay=SEC), thread(11, START + 10, cpu=SEC)])],
        300 * SEC)  # fmt: skip
    (delta,) = later.deltas
    assert (delta.fields.on_cpu_nanos, delta.fields.run_delay_nanos) == (0, 0)


def test_a_reused_pid_after_a_closed_process_is_counted():
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC)])
    tracker = two_passes(read, second=[read])
    tracker.close([record(10, at=210 * SEC, lived=210 * SEC - START * TICK_NS, on_cpu=2 * SEC)])
    new_start = 250 * SEC // TICK_NS
    reused = proc(10, new_start, at=300 * SEC, threads=[thread(10, new_start, cpu=SEC)])
    later = tracker.advance([reused], 300 * SEC)
    assert [d.born for d in later.deltas] == [True]


def test_a_process_no_pass_could_read_since_adds_only_its_last_threads_fields():
    """A process read at 100 s and 200 s, then unreadable to every pass (not in their
    readings); its last task, a thread born at 450 s, exits at 520 s. The thread was read
    by no pass: its fields count whole. Its process was, before its readings went: its
    user time, its one process and its life are not counted again."""
    read = [proc(10, START, at=at * SEC, threads=[thread(10, START, cpu=SEC)]) for at in (100, 200)]
    tracker = passes_every(100, [read[0]], [read[1]], [], [], [])
    born_at = 450 * SEC
    closed = tracker.close(
        [record(11, 10, at=520 * SEC, lived=520 * SEC - born_at, last=True,
                group_lived=520 * SEC - START * TICK_NS, on_cpu=SEC, utime_us=10**6)]
    )  # fmt: skip
    assert closed.outcomes == {"born": 1}
    fields = closed.deltas[0].fields
    assert fields.on_cpu_nanos == SEC
    assert (fields.processes, fields.observed_nanos, fields.cpu_user_nanos) == (0, 0, 0)


def test_the_clocks_read_apart_are_no_suspend():
    """The time suspended is CLOCK_BOOTTIME less CLOCK_MONOTONIC, two reads µs apart, or
    ms where the reader was preempted between them: a thread born and gone in a live
    process the cache holds counts whole however the two reads fell, short of a suspend
    (SUSPEND_SLACK_NS); past it, it could be a task the passes counted (its life ran on
    the stopped clock) and closes nothing."""
    from collector.closing import SUSPEND_SLACK_NS

    read = proc(10, START, at=200 * SEC, threads=[thread(10, START)])
    for slept, outcome in ((3 * 10**6, "born"), (SUSPEND_SLACK_NS + 1, "unmatched")):
        tracker = Tracker(HZ)
        tracker.keeps_replaced = True
        tracker.advance([read], 100 * SEC, read_until_ns=100 * SEC)
        tracker.advance([read], 200 * SEC, read_until_ns=200 * SEC)
        closed = tracker.close(
            [record(55, 10, at=210 * SEC, lived=2 * SEC, last=False,
                    group_lived=210 * SEC - START * TICK_NS, on_cpu=SEC)],
            slept_ns=slept,
        )  # fmt: skip
        assert closed.outcomes == {outcome: 1}, slept


# -- what mutmut's run over tracker.py found: each survivor a test -----------------------------


def test_each_counter_of_a_record_closes_its_own_field_and_a_zombie_read_after_adds_none():
    """Each of a record's six thread counters closes its own field (final less cached); the
    cached thread then takes all six, so a pass that reads the thread's zombie adds
    nothing; a thread born and gone counts each of the six whole."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC, delay=SEC, vol=1,
                                                 invol=2, rd=10, wr=20)]  # fmt: skip
    read = proc(10, START, at=200 * SEC, threads=both)
    tracker = two_passes(read, second=[read])
    gone = record(11, 10, at=210 * SEC, lived=210 * SEC - (START + 10) * TICK_NS, last=False,
                  group_lived=210 * SEC - START * TICK_NS, on_cpu=2 * SEC, delay=3 * SEC,
                  vol=4, invol=7, rd=110, wr=220)  # fmt: skip
    born = record(55, 10, at=210 * SEC, lived=2 * SEC, last=False,
                  group_lived=210 * SEC - START * TICK_NS, on_cpu=5, delay=6, vol=7,
                  invol=8, rd=9, wr=11)  # fmt: skip
    closed = tracker.close([gone, born])
    six = ("on_cpu_nanos", "run_delay_nanos", "voluntary_switches", "nonvoluntary_switches",
           "read_bytes", "write_bytes")  # fmt: skip
    got = [tuple(getattr(d.fields, name) for name in six) for d in closed.deltas]
    assert got == [(SEC, 2 * SEC, 3, 5, 100, 200), (5, 6, 7, 8, 9, 11)]
    zombie = thread(11, START + 10, cpu=2 * SEC, delay=3 * SEC, vol=4, invol=7, rd=110, wr=220)
    later = tracker.advance([proc(10, START, at=300 * SEC, threads=[both[0], zombie])], 300 * SEC)
    (delta,) = later.deltas
    assert tuple(getattr(delta.fields, name) for name in six) == (0,) * 6


def test_a_thread_that_moved_by_one_since_its_read_closes_that_one():
    """A record one switch past the cached thread, every other counter the same: the thread
    ran once more before it exited, and that switch is its last interval."""
    read = proc(
        10,
        START,
        at=200 * SEC,
        threads=[thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC, vol=3)],
    )
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(11, 10, at=210 * SEC, lived=210 * SEC - (START + 10) * TICK_NS, last=False,
                group_lived=210 * SEC - START * TICK_NS, on_cpu=SEC, vol=4)]
    )  # fmt: skip
    assert closed.outcomes == {"closed": 1}
    assert closed.deltas[0].fields.voluntary_switches == 1


def test_each_record_of_a_batch_is_counted_by_its_own_outcome():
    """One `close` of many records: each comes to its own end, counted once (late,
    unmatched, a counter that fell, read past its exit, closed, born), and one that
    comes to an end does not stop the records after it. A record that waited exactly
    START_TOLERANCE_NS is not late."""
    readings = [
        proc(pid, START, at=200 * SEC, threads=[thread(pid, START, cpu=cpu, vol=5)])
        for pid, cpu in ((10, 3 * SEC), (20, 3 * SEC), (30, 3 * SEC), (40, 3 * SEC),
                         (50, 4 * SEC + 5000), (60, 4 * SEC + 5000))
    ]  # fmt: skip
    tracker = two_passes(*readings, second=readings)
    lived = 230 * SEC - START * TICK_NS

    def batch(late, old, fell, read, closed, born, waited=0):
        return [
            record(late, at=230 * SEC, lived=SEC, waited=START_TOLERANCE_NS + 1),
            record(old, at=230 * SEC, lived=200 * SEC),
            record(fell, at=230 * SEC, lived=lived, on_cpu=4 * SEC, vol=1),
            record(read, at=230 * SEC, lived=lived, on_cpu=4 * SEC, vol=5),
            record(closed, at=230 * SEC, lived=lived, waited=waited, on_cpu=4 * SEC, vol=5),
            record(born, at=230 * SEC, lived=SEC),
        ]

    records = batch(71, 81, 30, 50, 10, 91) + batch(72, 82, 40, 60, 20, 92, START_TOLERANCE_NS)
    outcome = tracker.close(records).outcomes
    assert outcome == {"late": 2, "unmatched": 2, "counter_fell": 2, "read": 2, "closed": 2,
                       "born": 2}  # fmt: skip


def test_a_new_process_gone_before_any_pass_sums_every_task_gone_before_its_last():
    """A process born since, never read, three tasks: the two gone first are held
    (`_Pending`) and each adds its user and system time and major faults to the last's.
    A process under the PID since reused takes nothing of the one before it: not once
    that one's last record came (however close their starts), nor where its last never
    came and the two started more than START_TOLERANCE_NS apart."""
    tracker = two_passes(second=[])
    first = record(90, 90, at=180 * SEC, lived=30 * MS, group_lived=30 * MS, last=False,
                   utime_us=1000, stime_us=10, majflt=2)  # fmt: skip
    second = record(91, 90, at=180 * SEC, lived=20 * MS, group_lived=30 * MS, last=False,
                    utime_us=3000, stime_us=30, majflt=4)  # fmt: skip
    last = record(92, 90, at=181 * SEC, lived=5 * MS, group_lived=1030 * MS,
                  utime_us=2000, stime_us=20, majflt=1)  # fmt: skip
    (*_, delta) = tracker.close([first, second, last]).deltas
    assert (delta.fields.cpu_user_nanos, delta.fields.cpu_system_nanos) == (6 * MS, 60_000)
    assert (delta.fields.major_faults, delta.fields.processes) == (7, 1)
    # PID 90 again, started 1.5 s after the first: its own tasks alone
    again = [record(93, 90, at=182 * SEC, lived=MS, group_lived=500 * MS, last=False,
                    utime_us=500),
             record(90, 90, at=182 * SEC, lived=500 * MS, utime_us=100)]  # fmt: skip
    (*_, delta) = tracker.close(again).deltas
    assert delta.fields.cpu_user_nanos == 600_000
    # PID 95: a task gone, its last never came; PID 95 again 5 s later: its own alone
    tracker.close([record(96, 95, at=183 * SEC, lived=MS, group_lived=MS, last=False,
                          utime_us=7000)])  # fmt: skip
    again = [record(97, 95, at=188 * SEC, lived=MS, group_lived=10 * MS, last=False,
                    utime_us=500),
             record(95, 95, at=188 * SEC, lived=10 * MS, utime_us=100)]  # fmt: skip
    (*_, delta) = tracker.close(again).deltas
    assert delta.fields.cpu_user_nanos == 600_000


def test_the_tasks_of_a_process_never_read_are_held_for_two_passes_then_forgotten():
    """The times of a gone task of a process no pass has read are held until its last
    task's record, or a pass that reads the process (its `stat` has them), for two passes
    after the one they came in; at the third, with no record, they are forgotten."""
    for passes, user in ((2, 3_000_000), (3, 2_000_000)):
        tracker = two_passes(second=[])
        tracker.close([record(91, 90, at=201 * SEC, lived=MS, group_lived=2 * MS, last=False,
                              utime_us=1000)])  # fmt: skip
        other = proc(10, START, at=300 * SEC)
        for n in range(passes):
            tracker.advance([other], (300 + n) * SEC)
        (delta,) = tracker.close([record(90, 90, at=301 * SEC, lived=100 * SEC + MS,
                                         utime_us=2000)]).deltas  # fmt: skip
        assert delta.fields.cpu_user_nanos == user, passes


def test_a_suspend_is_measured_from_the_pass_whose_readings_went_last():
    """The time suspended a record's start may be off by is the growth since the end of
    the latest pass whose readings went (`_forgotten_ns`), not the machine's whole time
    suspended: with 100 s slept before the passes and 1 s since, a task born after that
    pass, not held, counts whole, and its process too where it started after that pass
    by more than its wait and the suspend; one that may have started before it does not."""
    tracker = tracker_for_exits()
    asleep = 100 * SEC
    tracker.advance([proc(10, START, at=100 * SEC)], 100 * SEC, slept_ns=asleep)
    for listed in (200, 300, 400):  # 10 gone at 200 s; what it left goes at 400 s
        tracker.advance([], listed * SEC, slept_ns=asleep)
    assert tracker._forgotten_ns == 200 * SEC
    closed = tracker.close(
        [
            record(77, at=360 * SEC, lived=10 * SEC),  # born at 350 s
            record(78, at=360 * SEC, lived=160 * SEC - SEC // 2),  # at 200.5 s: may be before
            # a thread born at 350 s, its process at 200.5 s or 202 s (waited 0.6 s), or 201 s
            record(81, 80, at=360 * SEC, lived=10 * SEC, waited=600 * MS,
                   group_lived=160 * SEC - SEC // 2, utime_us=1000),
            record(83, 82, at=360 * SEC, lived=10 * SEC, waited=600 * MS,
                   group_lived=158 * SEC, utime_us=1000),
            record(85, 84, at=360 * SEC, lived=10 * SEC, group_lived=159 * SEC, utime_us=1000),
        ],
        slept_ns=asleep + SEC,
    )  # fmt: skip
    assert closed.outcomes == {"born": 4, "unmatched": 1}
    processes = {d.record.tgid: d.fields.processes for d in closed.deltas}
    assert processes == {77: 1, 80: 0, 82: 1, 84: 0}


def test_a_process_closed_counts_once_and_its_zombie_read_hides_no_process_after_it():
    """A process's last record counts it (`processes` 1) unless the pass before took a
    delta of it: one that pass saw first (refused, no delta) counts. A pass that then
    reads the closed process's zombie skips it alone: the processes after it are guarded."""
    ten, thirty = (proc(pid, START, at=100 * SEC, threads=[thread(pid, START, cpu=3 * SEC)])
                   for pid in (10, 30))  # fmt: skip
    twenty = proc(20, START, at=200 * SEC, threads=[thread(20, START, cpu=3 * SEC)])
    tracker = two_passes(ten, thirty, second=[ten, twenty, thirty])
    lived = 230 * SEC - START * TICK_NS
    closed = tracker.close([record(pid, at=230 * SEC, lived=lived, on_cpu=4 * SEC)
                            for pid in (10, 20)])  # fmt: skip
    assert [d.fields.processes for d in closed.deltas] == [0, 1]
    zombie = proc(10, START, at=300 * SEC, threads=[thread(10, START, cpu=4 * SEC)])
    ran = proc(30, START, at=300 * SEC, threads=[thread(30, START, cpu=5 * SEC)])
    later = tracker.advance([zombie, ran], 300 * SEC)
    assert [(d.reading.pid, d.fields.on_cpu_nanos) for d in later.deltas] == [(30, 2 * SEC)]


# -- the gaps mutmut's run left in tracker.py: each a test ------------------------------------


def test_a_thread_of_a_process_of_many_threads_is_found_by_its_tid():
    """A process of more than 8 threads is looked up through an index of its threads by
    TID: each record closes its own thread there, the second as the first."""
    threads = [thread(10, START)] + [thread(tid, START + 10, cpu=SEC) for tid in range(11, 20)]
    read = proc(10, START, at=200 * SEC, threads=threads)
    tracker = two_passes(read, second=[read])
    at = 210 * SEC
    closed = tracker.close(
        [record(tid, 10, at=at, lived=at - (START + 10) * TICK_NS, last=False,
                group_lived=at - START * TICK_NS, on_cpu=cpu)
         for tid, cpu in ((15, 3 * SEC), (18, 2 * SEC))]
    )  # fmt: skip
    assert closed.outcomes == {"closed": 2}
    assert [d.fields.on_cpu_nanos for d in closed.deltas] == [2 * SEC, SEC]


def test_a_growth_of_exactly_the_slack_in_the_time_suspended_is_a_suspend():
    """`SUSPEND_SLACK_NS` is the least growth taken for a suspend: a thread born and gone in
    a live process the cache holds, its life then possibly on the stopped clock, closes
    nothing where the machine's time suspended grew by exactly that much since passes that
    gave none (`slept_ns` left out: 0)."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START)])
    tracker = two_passes(read, second=[read])
    closed = tracker.close(
        [record(55, 10, at=210 * SEC, lived=2 * SEC, last=False,
                group_lived=210 * SEC - START * TICK_NS, on_cpu=SEC)],
        slept_ns=SUSPEND_SLACK_NS,
    )  # fmt: skip
    assert closed.outcomes == {"unmatched": 1}


def test_a_task_read_when_its_record_may_have_come_already_is_not_read_alive():
    """A task the pass read, its record's counters the same: read before the earliest its
    record may have come (its arrival less its wait), it was alive, a sleeper killed, and
    its process closes; read at that very instant, it may have exited already (a zombie
    read past its record): nothing is left to close."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC, vol=5)])
    for waited, outcome in ((SEC - 1, "closed"), (SEC, "read")):
        tracker = two_passes(read, second=[read])
        closed = tracker.close([record(10, at=201 * SEC, lived=201 * SEC - START * TICK_NS,
                                       waited=waited, on_cpu=SEC, vol=5)])  # fmt: skip
        assert closed.outcomes == {outcome: 1}, waited


def test_the_gone_tasks_of_a_process_started_the_tolerance_apart_are_its_own():
    """The tasks gone of a process no pass read are held for its last one's record while
    the two say it started within START_TOLERANCE_NS of each other, that far apart too."""
    tracker = two_passes(second=[])
    first = record(91, 90, at=180 * SEC, lived=MS, group_lived=30 * MS, last=False,
                   utime_us=1000)  # fmt: skip
    last = record(90, 90, at=182 * SEC, lived=30 * MS, utime_us=2000)
    assert last.group_start_ns - first.group_start_ns == START_TOLERANCE_NS
    (*_, delta) = tracker.close([first, last]).deltas
    assert delta.fields.cpu_user_nanos == 3 * MS


def test_at_short_intervals_the_last_max_kept_passes_leftovers_are_kept_and_no_more():
    """Passes every 10 ms, each leaving something: thread 11, read by the first, gone by
    the second, is closed by its record while the second pass is among the last
    MAX_KEPT_PASSES passes; one pass later what it left is gone, and the record closes
    nothing (the thread started before that pass: it may have been counted)."""
    both = [thread(10, START), thread(11, START + 1, cpu=SEC)]
    gone = record(11, 10, at=101 * SEC, lived=int(100.001 * SEC) - (START + 1) * TICK_NS,
                  waited=SEC, last=False, group_lived=int(100.001 * SEC) - START * TICK_NS,
                  on_cpu=2 * SEC)  # fmt: skip
    for passes, outcome in ((MAX_KEPT_PASSES + 1, "closed"), (MAX_KEPT_PASSES + 2, "unmatched")):
        tracker = tracker_for_exits()
        for k in range(passes):
            at = 100 * SEC + k * 10 * MS
            threads = both if k == 0 else both[:1]
            tracker.advance([proc(10, START, at=at, threads=threads),
                             proc(50 + k % 2, START, at=at)], at, read_until_ns=at)  # fmt: skip
        assert tracker.close([gone]).outcomes == {outcome: 1}, passes


def test_what_a_pass_left_is_kept_while_a_record_received_since_the_last_pass_may_close_it():
    """Thread 11 gone by the pass that read until 101 s; passes listed at 103 s (2 s
    later: START_TOLERANCE_NS) and at 110 s. Its record, received at 103 s, may have waited
    2 s (not late): at that instant a record can still close it, so it is kept, and
    closes it from its reading of 100 s."""
    both = [thread(10, START), thread(11, START + 1, cpu=SEC)]
    tracker = tracker_for_exits()
    tracker.advance([proc(10, START, at=100 * SEC, threads=both)], 100 * SEC)
    for at in (101, 103, 110):
        tracker.advance([proc(10, START, at=at * SEC, threads=both[:1])], at * SEC,
                        read_until_ns=at * SEC)  # fmt: skip
    closed = tracker.close(
        [record(11, 10, at=103 * SEC, lived=101 * SEC - (START + 1) * TICK_NS,
                waited=START_TOLERANCE_NS, last=False,
                group_lived=101 * SEC - START * TICK_NS, on_cpu=2 * SEC)]
    )  # fmt: skip
    assert closed.outcomes == {"closed": 1} and closed.deltas[0].fields.on_cpu_nanos == SEC


def test_a_zombie_leader_read_past_its_record_leaves_its_live_process_counted():
    """The leader thread exits while the process lives on in another thread; a pass reads
    the leader's zombie before its record (not the last task's) comes: nothing is left to
    close of the leader, and the process is not closed: the next pass counts it."""
    both = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC)]
    tracker = two_passes(proc(10, START, at=100 * SEC, threads=both),
                         second=[proc(10, START, at=200 * SEC, threads=both)])  # fmt: skip
    exited = int(199.95 * SEC)
    closed = tracker.close([record(10, 10, at=int(200.5 * SEC), lived=exited - START * TICK_NS,
                                   last=False, waited=600 * MS, on_cpu=SEC)])  # fmt: skip
    assert closed.outcomes == {"read": 1}
    later = tracker.advance(
        [proc(10, START, at=300 * SEC, threads=[both[0], thread(11, START + 10, cpu=3 * SEC)])],
        300 * SEC,
    )
    assert [d.fields.on_cpu_nanos for d in later.deltas] == [2 * SEC]


def test_a_record_come_before_the_instant_its_reading_stands_for_observes_nothing():
    """A record received while the pass read its process (it is taken after that pass)
    may come before the instant the process's reading stands for: its last interval has
    its thread fields, and no time observed, never a negative or a made-up one."""
    read = proc(10, START, at=200 * SEC, threads=[thread(10, START, cpu=SEC)])
    tracker = two_passes(read, second=[read])
    at = 200 * SEC - 10 * MS
    closed = tracker.close([record(10, at=at, lived=at - START * TICK_NS, on_cpu=2 * SEC)])
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1} and delta.fields.on_cpu_nanos == SEC
    assert (delta.fields.processes, delta.fields.observed_nanos) == (0, 0)


def test_a_carried_process_whose_pid_is_reused_is_observed_from_its_carried_instant():
    """Read at 100 s, carried at 200 s, gone at 250 s; a new process under its PID is read
    at 300 s, replacing its reading: its record closes its last interval from 200 s, the
    instant it was last carried to, not from its reading of 100 s."""
    old = proc(10, START, at=100 * SEC, threads=[thread(10, START, cpu=SEC)])
    tracker = tracker_for_exits()
    tracker.advance([old], 100 * SEC)
    tracker.advance([], 200 * SEC, carry(old), 200 * SEC)
    new_start = 260 * SEC // TICK_NS
    tracker.advance([proc(10, new_start, at=300 * SEC, threads=[thread(10, new_start)])],
                    300 * SEC)  # fmt: skip
    closed = tracker.close([record(10, at=250 * SEC, lived=250 * SEC - START * TICK_NS,
                                   on_cpu=2 * SEC)])  # fmt: skip
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1} and delta.fields.on_cpu_nanos == SEC
    assert (delta.fields.processes, delta.fields.observed_nanos) == (1, 50 * SEC)


def test_a_process_gone_from_a_block_carried_again_is_observed_from_the_blocks_instant():
    """Two processes carried in one block at 160 s and 200 s; at 250 s the block is
    carried without one of them, which exited at 230 s: its record closes its last
    interval from 200 s, the block's last instant, which it keeps on leaving it."""
    a, b = proc(10, START, at=100 * SEC), proc(20, START, at=100 * SEC)
    tracker = tracker_for_exits()
    tracker.advance([a, b], 100 * SEC)
    block = carry(a, b)
    tracker.advance([], 160 * SEC, block, 160 * SEC)
    tracker.advance([], 200 * SEC, block, 200 * SEC)
    tracker.advance([], 250 * SEC, carry(b), 250 * SEC)
    closed = tracker.close([record(10, at=230 * SEC, lived=230 * SEC - START * TICK_NS)])
    (delta,) = closed.deltas
    assert closed.outcomes == {"closed": 1}
    assert (delta.fields.processes, delta.fields.observed_nanos) == (1, 30 * SEC)


def test_a_task_gone_from_a_process_whose_other_thread_ran_is_kept_for_its_record():
    """Thread 11 read at 100 s, gone by 200 s, when thread 10 had run: the pass notices a
    task gone (one thread of two matched) and keeps the reading of 100 s for its record."""
    first = [thread(10, START, cpu=SEC), thread(11, START + 10, cpu=SEC)]
    tracker = two_passes(proc(10, START, at=100 * SEC, threads=first),
                         second=[proc(10, START, at=200 * SEC,
                                      threads=[thread(10, START, cpu=2 * SEC)])])  # fmt: skip
    closed = tracker.close(
        [record(11, 10, at=201 * SEC, lived=201 * SEC - (START + 10) * TICK_NS, last=False,
                group_lived=201 * SEC - START * TICK_NS, on_cpu=3 * SEC)]
    )  # fmt: skip
    assert closed.outcomes == {"closed": 1} and closed.deltas[0].fields.on_cpu_nanos == 2 * SEC

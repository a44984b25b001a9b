"""Exit records in a pass (`Engine._close_exits`, collector/engine.py): each closed delta into
the group of the process the cache held, or, for a task born and gone, its nearest ancestor's
whose group is known (collector/lineage.py), found by PID and life; what no file places on
the node's unplaced counters; `--pods-only` as for the processes read."""

from __future__ import annotations

import pytest

from collector.exits import (
    Fold,
    pack_stats,
)
from collector.groups import UNPLACED
from tests.exitrecords import QueuedListener, taskstats
from tests.fixturetree import FixtureRun
from tests.unit.test_tracker import SEC, TICK_NS


def engine_after_a_pass(pods_only: bool = False, unplace: bytes | None = None):
    """The fixture node's engine (tests/fixturetree.py), listening, after its first pass;
    with `unplace`, processes whose cgroup file holds it are in no group a file tells."""
    run = FixtureRun(pods_only=pods_only)
    engine = run.engine
    engine.exits = QueuedListener()
    engine.tracker.keeps_replaced = True
    if unplace is not None:
        real = engine.grouper.group_of
        engine.grouper.group_of = lambda text: UNPLACED if unplace in text else real(text)
    engine.run_pass()
    run.sleep(10)
    return engine


def born_record(ppid: int, on_cpu: int, pid: int = 60000, *, lived_us: int = 1000,
                received: int = 1010 * SEC + SEC // 2) -> bytes:  # fmt: skip
    """A task born and gone between the fixture's two passes, packed as the listener holds it."""
    return pack_stats(taskstats(pid, pid, ppid=ppid, lived_us=lived_us, on_cpu=on_cpu), received)


def group_of(engine, pid: int):
    """The group of the process the engine's cache holds (or last held) as PID `pid`."""
    reading, _ = next(engine.tracker.held(pid))
    return engine.grouper.group_of(reading.cgroup)


def test_a_task_born_and_gone_counts_in_its_parents_group():
    engine = engine_after_a_pass()
    engine.exits.queue.append(born_record(200, 7_000_001))  # 200: a pod's process
    result = engine.run_pass()
    pod = group_of(engine, 200)
    assert result.intervals[pod].on_cpu_nanos >= 7_000_001
    assert result.exits == {"born": 1}


def test_pods_only_leaves_a_non_pod_parents_child_out_and_a_pods_in():
    engine = engine_after_a_pass(pods_only=True)
    engine.exits.queue += [born_record(100, 7_000_001, 60000), born_record(300, 5_000_003, 60001)]
    result = engine.run_pass()
    assert result.exits_unplaced.on_cpu_nanos == 0
    assert sum(f.on_cpu_nanos for f in result.intervals.values()) % 10 == 3  # the pod's only


@pytest.mark.parametrize("pods_only", [False, True])
def test_a_child_of_an_unplaced_parent_is_counted_unplaced_not_dropped(pods_only):
    engine = engine_after_a_pass(pods_only=pods_only, unplace=b"odd.service")
    engine.exits.queue.append(born_record(100, 7_000_000))
    result = engine.run_pass()
    assert result.exits_unplaced.on_cpu_nanos == 7_000_000
    assert result.exits == {"born": 1, "unplaced": 1}


def held_100_record(ppid: int = 200) -> bytes:
    """Process 100 of the fixture (started at 500 ticks, odd.service): its last record."""
    lived_us = (1010 * SEC + SEC // 2 - 500 * TICK_NS) // 1000
    return pack_stats(taskstats(100, 100, ppid=ppid, lived_us=lived_us, on_cpu=3_000_777,
                                delay=15000, vol=13, invol=2, wr=4096),
                      1010 * SEC + SEC // 2)  # fmt: skip


def test_a_held_process_closes_in_its_own_group_not_its_parents():
    engine = engine_after_a_pass()
    engine.exits.queue.append(held_100_record(ppid=200))
    result = engine.run_pass()
    odd, pod = group_of(engine, 100), group_of(engine, 200)
    assert result.exits == {"closed": 1}
    assert result.intervals[odd].on_cpu_nanos % 1000 == 777
    assert result.intervals[pod].on_cpu_nanos % 1000 != 777


def test_pods_only_drops_a_held_non_pod_processs_record_without_calling_it_unplaced():
    engine = engine_after_a_pass(pods_only=True)
    engine.exits.queue.append(held_100_record(ppid=200))
    result = engine.run_pass()
    assert result.exits == {"closed": 1} and result.exits_unplaced.on_cpu_nanos == 0


def test_a_child_of_a_parent_gone_since_the_last_pass_counts_in_that_parents_group():
    """600 was read by the first pass (the cart pod) and is gone from the second's /proc;
    its child exited at 1005 s, before the second pass found 600 gone."""
    engine = engine_after_a_pass()
    engine.exits.queue.append(born_record(600, 7_000_001, received=1005 * SEC))
    result = engine.run_pass()
    assert result.exits == {"born": 1} and result.exits_unplaced.on_cpu_nanos == 0
    cart = group_of(engine, 200)
    assert result.intervals[cart].on_cpu_nanos % 10 == 1


def cart_gains(
    queue: list[bytes], overflows: int = 0, folds: list[Fold] = (), gone: tuple[int, ...] = ()
) -> tuple[int, object]:
    """The on-CPU the cart pod (200's, and 600's in the first pass) gains in the second
    pass from these records and folds, against the same pass without them; and the pass.
    The PIDs `gone` are gone from `/proc` when the records are placed."""
    gains = []
    for given, folds_given in (([], []), (queue, folds)):
        engine = engine_after_a_pass()
        life_now = engine._life_now
        engine._life_now = lambda pid, life_now=life_now: [] if pid in gone else life_now(pid)
        engine.exits.overflows = overflows
        engine.exits.queue += given
        engine.exits.folds += folds_given
        result = engine.run_pass()
        gains.append(result.intervals[group_of(engine, 200)].on_cpu_nanos)
    return gains[1] - gains[0], result


def test_a_parent_gone_since_the_last_pass_is_no_parent_past_its_own_end():
    """600 (the cart pod's, begun at 8 s, read by the first pass) ended at 1004 s, as its
    own record says; PID 600 was then taken again (a tenant cycling PIDs, its own record
    lost): a child begun at 1004.5 s is not the cart's; one begun at 1003 s and gone
    before 1004 s is."""
    half = SEC // 2 // 1000  # µs
    gain, _ = cart_gains([
        born_record(600, 7_000_001, 60000, lived_us=half, received=1005 * SEC),
        born_record(600, 5_000_010, 60001, lived_us=half, received=1003 * SEC + SEC // 2),
        pack_stats(taskstats(600, 600, ppid=1, lived_us=996 * 10**6, on_cpu=1), 1004 * SEC),
    ])  # fmt: skip
    assert gain == 5_000_010


def test_where_records_were_lost_a_parent_gone_without_its_end_is_no_parent():
    """As above, 600's own record lost with others (the socket overflowed): when it ended
    is not known, and a child naming 600 may be a later holder's: it waits a pass, then
    is unplaced, never moved into the cart pod. Where none was lost, it is the cart's."""
    record = born_record(600, 7_000_001, received=1005 * SEC)
    assert cart_gains([record])[0] == 7_000_001
    gain, result = cart_gains([record], overflows=1)
    assert gain == 0 and result.exits == {"born": 1}


def test_a_child_of_an_unknown_parent_waits_one_pass_then_is_unplaced():
    """No holder of its parent's PID is known: its parent's own record may come with the
    next pass's records; where it does not, the task is counted unplaced then."""
    engine = engine_after_a_pass()
    engine.exits.queue.append(born_record(99999, 7_000_000))
    result = engine.run_pass()
    assert result.exits == {"born": 1}
    assert result.exits_unplaced.on_cpu_nanos == 0
    assert sum(f.on_cpu_nanos for f in result.intervals.values()) % 1000 == 0  # not yet
    result = engine.run_pass()
    assert result.exits == {"unplaced": 1}
    assert result.exits_unplaced.on_cpu_nanos == 7_000_000


LIVED_SINCE_1003_US = (1010 * SEC + SEC // 2 - 1003 * SEC) // 1000


def test_a_child_of_a_short_lived_parent_counts_in_the_parents_parents_group():
    """A child (born at 1003 s) of 60001, a process born after it at 1002 s and gone after
    it (its record comes after the child's, as a parent reaps its child first), whose own
    parent is 200, a pod's process: both count in 200's pod."""
    engine = engine_after_a_pass()
    engine.exits.queue += [
        born_record(60001, 7_000_001, 60000, lived_us=LIVED_SINCE_1003_US,
                    received=1010 * SEC + SEC // 2),
        born_record(200, 5_000_002, 60001, lived_us=LIVED_SINCE_1003_US + 10**6,
                    received=1010 * SEC + SEC // 2 + 1000),
    ]  # fmt: skip
    result = engine.run_pass()
    assert result.exits == {"born": 2} and result.exits_unplaced.on_cpu_nanos == 0
    assert result.intervals[group_of(engine, 200)].on_cpu_nanos % 1000 == 3


def test_a_parents_record_in_the_next_pass_places_the_child_then():
    """The child's record comes in one pass's records and its short-lived parent's in the
    next: the child waits one pass, then counts in the parent's parent's group with it."""
    engine = engine_after_a_pass()
    engine.exits.queue.append(born_record(60001, 7_000_001, 60000, lived_us=LIVED_SINCE_1003_US))
    result = engine.run_pass()
    assert result.exits == {"born": 1}
    engine.reader.clock.now = 1020 * SEC
    lived = (1019 * SEC - 1002 * SEC) // 1000
    engine.exits.queue.append(born_record(200, 5_000_002, 60001, lived_us=lived,
                                          received=1019 * SEC))  # fmt: skip
    result = engine.run_pass()
    assert result.exits == {"born": 1} and result.exits_unplaced.on_cpu_nanos == 0
    assert result.intervals[group_of(engine, 200)].on_cpu_nanos % 1000 == 3


def test_a_pid_taken_again_after_the_child_began_is_not_its_parent():
    """PID 500 was odd.service's process from 6 s, and is another since 1005 s (the
    fixture's second pass). A child born at 1003 s naming 500 as its parent at its exit
    (1010.5 s): neither holder fits (the first was gone by the second pass, before the
    child's exit; the second began after the child), so the child is never the second's;
    a child born at 1006 s is."""
    engine = engine_after_a_pass()
    engine.exits.queue += [
        born_record(500, 7_000_001, 60000, lived_us=LIVED_SINCE_1003_US),
        born_record(500, 5_000_010, 60002, lived_us=LIVED_SINCE_1003_US - 3 * 10**6),
    ]
    result = engine.run_pass()
    odd = group_of(engine, 500)
    assert result.intervals[odd].on_cpu_nanos % 1000 == 10
    result = engine.run_pass()
    assert result.exits == {"unplaced": 1} and result.exits_unplaced.on_cpu_nanos == 7_000_001


def test_init_is_no_ancestor():
    """A child that names PID 1 (an orphan, reaped by the host's init) is unplaced, not
    counted in init's group."""
    engine = engine_after_a_pass()
    engine.exits.queue.append(born_record(1, 7_000_000))
    result = engine.run_pass()
    assert result.exits == {"born": 1, "unplaced": 1}


def folded(tgid: int, ppid: int, start_ns: int, born: bool, seen_ns: int | None = None) -> Fold:
    """Three threads of process `tgid` folded as they came (collector/exits.py, `Fold`), the
    first of them gone at `seen_ns` (by default a second after the process began)."""
    seen = start_ns + SEC if seen_ns is None else seen_ns
    fold = Fold(tgid, ppid, start_ns, 0, born, seen)
    fold.tasks, fold.on_cpu_ns, fold.run_delay_ns = 3, 9_000_003, 300
    fold.voluntary_switches, fold.read_bytes, fold.write_bytes = 3, 4096, 8192
    fold.utime_us, fold.stime_us, fold.major_faults = 6000, 3000, 2
    return fold


def test_folded_threads_of_a_held_process_count_in_its_group_their_stat_fields_not():
    """200 (the pod's, begun at 900 ticks) had three threads folded: their thread fields in
    its group, counted `born`; their user and system time are in its `stat` at its next
    read, not taken from the records."""
    engine = engine_after_a_pass()
    engine.exits.folds.append(folded(200, 1, 9 * SEC + 5 * 10**6, born=False))
    result = engine.run_pass()
    pod = result.intervals[group_of(engine, 200)]
    assert pod.on_cpu_nanos % 1000 == 3 and pod.write_bytes % 8192 == 0
    assert result.exits == {"born": 3}
    assert engine.tracker._pending == {}


def test_a_born_process_folded_threads_bring_their_times_with_its_last_record():
    """Process 61000, begun at 1005 s (after the first pass) and gone before the second:
    three threads folded, then its last task's record, which brings the process's user and
    system time (its threads' with its own), in the group of its parent, 200."""
    engine = engine_after_a_pass()
    start = 1005 * SEC
    engine.exits.folds.append(folded(61000, 200, start, born=True))
    last = pack_stats(taskstats(61000, 61000, ppid=200, lived_us=(1010 * SEC - start) // 1000,
                                on_cpu=1_000_000, utime_us=1000, stime_us=500),
                      1010 * SEC)  # fmt: skip
    engine.exits.queue.append(last)
    result = engine.run_pass()
    pod = result.intervals[group_of(engine, 200)]
    assert result.exits == {"born": 4}
    assert pod.on_cpu_nanos % 1000 == 3  # 9,000,003 folded and 1,000,000 of its last
    # `stat`'s are whole ticks (10 ms): what is below one is the records'
    assert pod.cpu_user_nanos % 10**7 == (6000 + 1000) * 1000
    assert pod.cpu_system_nanos % 10**7 == (3000 + 500) * 1000


def test_folded_threads_of_a_born_process_are_not_a_gone_parents_past_its_end():
    """Process 61000, begun at 1004.5 s and never read, named 600 (the cart pod's, gone
    since the first pass) as its parent when its first thread exited at 1006 s; 600's own
    record says it ended at 1004 s, so PID 600 was another's by then (taken again): its
    threads are not the cart's. With its first thread gone at 1003.9 s, they are."""
    lived = 996 * 10**6  # µs: 600 began at 8 s
    end = pack_stats(taskstats(600, 600, ppid=1, lived_us=lived, on_cpu=1), 1004 * SEC)
    gains = {}
    for seen in (1006 * SEC, 1003 * SEC + 9 * 10**8):
        began = seen - SEC // 2
        gains[seen] = cart_gains([end], folds=[folded(61000, 600, began, True, seen)])[0]
    assert gains == {1006 * SEC: 0, 1003 * SEC + 9 * 10**8: 9_000_003}


def test_a_parent_read_alive_whose_record_came_is_no_parent_past_its_end():
    """200 (the pod's) was read alive by the second pass, and its last task's record came
    after, at 1010.5 s: a child begun after that, naming 200, is a later holder's (gone
    too, from `/proc` as from the records)."""
    lived = (1010 * SEC + SEC // 2 - 9 * SEC) // 1000  # 200 began at 900 ticks
    end = pack_stats(taskstats(200, 200, ppid=1, lived_us=lived, on_cpu=1), 1010 * SEC + SEC // 2)
    after = born_record(200, 7_000_001, 60000, lived_us=100_000, received=1010 * SEC + 7 * 10**8)
    before = born_record(200, 5_000_010, 60001, lived_us=100_000, received=1010 * SEC + 4 * 10**8)
    assert cart_gains([before, after, end], gone=(200,))[0] % 10**6 == 10  # and 200's own last


def test_a_parent_whose_record_came_a_pass_before_is_no_parent_past_its_end():
    """600 (the cart pod's) was read by two passes, its last task's record closing its
    interval in the second (at 1005 s); the third found it gone. A child begun at 1006 s
    naming 600 is not the cart's; one begun at 1004 s and gone by 1004.5 s is."""
    gains = []
    records = [
        born_record(600, 7_000_001, 60000, lived_us=3 * 10**6, received=1009 * SEC),
        born_record(600, 5_000_010, 60001, lived_us=SEC // 2 // 1000, received=1004_500_000_000),
    ]
    for children in ([], records):
        run = FixtureRun()
        engine = run.engine
        engine.exits = QueuedListener()
        engine.tracker.keeps_replaced = True
        engine.run_pass()
        run.clock.now = 1005 * SEC
        lived = 997 * 10**6  # µs: 600 began at 8 s
        engine.exits.queue.append(
            pack_stats(taskstats(600, 600, ppid=1, lived_us=lived), 1005 * SEC)
        )
        engine.run_pass()
        run.sleep(10)
        engine.exits.queue += children
        result = engine.run_pass()
        gains.append(result.intervals[group_of(engine, 200)].on_cpu_nanos)
    assert gains[1] - gains[0] == 5_000_010


def test_records_lost_are_counted_by_the_group_of_their_tasks_parent():
    engine = engine_after_a_pass()
    engine.exits.lost.update({200: 3, 99999: 2, 1: 1})  # a pod's process, none, init
    result = engine.run_pass()
    assert result.exits_lost == {group_of(engine, 200): 3, UNPLACED: 3}


@pytest.mark.parametrize("quick", [True, False])
def test_a_thread_no_pass_read_queued_during_a_pass_counts_once_the_quick_way_or_not(quick):
    """A thread of 200 (the pod's) begun after the first pass and gone while the second
    read, so queued, not folded: counted whole in 200's group, `born`, once: taken before
    `Tracker.close` where the pass read 200 without it, or by `Tracker.close` itself."""
    engine = engine_after_a_pass()
    at = 1010 * SEC + SEC // 2
    stats = taskstats(60200, 200, ppid=1, last=False, lived_us=1000, on_cpu=7_000_007,
                      group_lived_us=(at - 9 * SEC) // 1000)  # fmt: skip
    engine.exits.queue.append(pack_stats(stats, at))
    if not quick:
        engine._read_until = None  # no pass before: `_unread` gives every record on
    taken = []
    close = engine.tracker.close
    engine.tracker.close = lambda records, **kw: close(
        (taken.append(r) or r for r in records), **kw
    )
    result = engine.run_pass()
    assert result.exits == {"born": 1}
    assert result.intervals[group_of(engine, 200)].on_cpu_nanos % 1000 == 7
    assert [r.pid for r in taken] == ([] if quick else [60200])

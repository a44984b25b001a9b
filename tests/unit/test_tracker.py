"""The guard as a table of passes: one row per pass, every rule of docs/reference.md §2."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from collector.model import ProcessReading, ThreadReading
from collector.readings import Carried
from collector.tracker import Advance, Tracker
from tests.readings import process_reading, thread_reading

HZ = 100
TICK_NS = 10_000_000
SEC = 1_000_000_000


def thread(tid, start, cpu=0, delay=0, vol=0, invol=0, rd=0, wr=0) -> ThreadReading:
    return thread_reading(
        tid=tid, start_ticks=start, on_cpu_ns=cpu, run_delay_ns=delay,
        voluntary_switches=vol, nonvoluntary_switches=invol, read_bytes=rd, write_bytes=wr,
    )  # fmt: skip


def proc(pid, start, at, user=0, system=0, faults=0, threads=None) -> ProcessReading:
    if threads is None:
        threads = (thread(pid, start),)
    return process_reading(
        pid=pid, start_ticks=start, at_ns=at, utime_ticks=user, stime_ticks=system,
        major_faults=faults, threads=threads,
    )  # fmt: skip


def carry(*readings: ProcessReading) -> list[Carried]:
    """The readings as the reader carries them: one block per cgroup file."""
    by_cgroup: dict[bytes, dict[int, ProcessReading]] = {}
    for reading in readings:
        by_cgroup.setdefault(reading.cgroup, {})[reading.pid] = reading
    return [
        Carried(cgroup, members, sum(len(r.threads) for r in members.values()), 0)
        for cgroup, members in by_cgroup.items()
    ]


def carried(outcome: Advance) -> dict[bytes, list[int]]:
    """Each carried block's processes accepted and their observed time, by cgroup file (a
    block with none accepted left out)."""
    return {d.cgroup: [len(d.readings), d.observed_ns] for d in outcome.carried if d.readings}


@dataclass
class Row:
    """One pass: what it listed (and when), what each PID must yield, what is refused."""

    why: str
    listed_at: int
    readings: list[ProcessReading]
    deltas: dict[int, dict[str, int]]
    refused: dict[str, int] = field(default_factory=dict)
    threads_refused: dict[str, int] = field(default_factory=dict)
    tracked: tuple[int, int] | None = None  # (processes, threads) after the pass


# Pass k begins listing at k * 100 s; a start of 15_000 ticks is 150 s since boot.
LIFE_OF_A_PID = [
    Row(
        "first sighting: no delta, and no birth rule on the first pass",
        100 * SEC,
        [proc(10, start=5_000, at=100 * SEC + 5, user=3, threads=[thread(10, 5_000, cpu=7)])],
        deltas={},
        refused={"first_seen": 1},
        tracked=(1, 1),
    ),
    Row(
        "same process again: delta of every counter, observed = between readings",
        200 * SEC,
        [
            proc(
                10,
                5_000,
                at=200 * SEC + 5,
                user=5,
                system=2,
                faults=4,
                threads=[thread(10, 5_000, cpu=100, delay=20, vol=3, invol=1, rd=4096, wr=512)],
            )
        ],
        deltas={
            10: dict(
                processes=1,
                observed_nanos=100 * SEC,
                on_cpu_nanos=93,
                run_delay_nanos=20,
                cpu_user_nanos=2 * TICK_NS,
                cpu_system_nanos=2 * TICK_NS,
                major_faults=4,
                voluntary_switches=3,
                nonvoluntary_switches=1,
                read_bytes=4096,
                write_bytes=512,
            )
        },
    ),
    Row(
        "PID reused by a process that started before the previous pass: no delta",
        300 * SEC,
        [proc(10, 15_000, at=300 * SEC, user=1, faults=9, threads=[thread(10, 15_000, cpu=9)])],
        deltas={},
        refused={"pid_reused": 1},
    ),
    Row(
        "one field fell (major faults): the whole delta is dropped, no field clamped",
        400 * SEC,
        [
            proc(10, 15_000, at=400 * SEC, user=50, faults=0, threads=[thread(10, 15_000, 99)]),
        ],
        deltas={},
        refused={"counter_fell": 1},
        tracked=(1, 1),
    ),
    Row(
        "PID reused by a process born after the previous pass began listing: whole counters",
        500 * SEC,
        [
            proc(
                10,
                start=45_000,
                at=500 * SEC,
                user=10,
                system=1,
                faults=2,
                threads=[thread(10, 45_000, cpu=70, delay=5, vol=2, invol=3, rd=1, wr=2)],
            )
        ],
        deltas={
            10: dict(
                processes=1,
                observed_nanos=50 * SEC,
                on_cpu_nanos=70,
                run_delay_nanos=5,
                cpu_user_nanos=10 * TICK_NS,
                cpu_system_nanos=TICK_NS,
                major_faults=2,
                voluntary_switches=2,
                nonvoluntary_switches=3,
                read_bytes=1,
                write_bytes=2,
            )
        },
    ),
    Row("the PID is gone: evicted", 600 * SEC, [], deltas={}, tracked=(0, 0)),
    Row(
        "it reappears: the cache forgot it, so first sighting again (not a delta over a gap)",
        700 * SEC,
        [proc(10, start=45_000, at=700 * SEC, user=90, threads=[thread(10, 45_000, 900)])],
        deltas={},
        refused={"first_seen": 1},
    ),
]


THREADS = [
    Row(
        "two threads seen first",
        100 * SEC,
        [proc(20, 1_000, 100 * SEC, threads=[thread(20, 1_000, cpu=10), thread(21, 1_000, 10)])],
        deltas={},
        refused={"first_seen": 1},
        tracked=(1, 2),
    ),
    Row(
        "a thread born between passes contributes its whole counters",
        200 * SEC,
        [
            proc(
                20,
                1_000,
                200 * SEC,
                threads=[
                    thread(20, 1_000, cpu=15, vol=1),
                    thread(21, 1_000, cpu=30, wr=100),
                    thread(22, 15_000, cpu=1_000, delay=4, vol=5, invol=6, rd=7, wr=8),
                ],
            )
        ],
        deltas={
            20: dict(
                processes=1,
                observed_nanos=100 * SEC,
                on_cpu_nanos=5 + 20 + 1_000,
                run_delay_nanos=4,
                voluntary_switches=1 + 5,
                nonvoluntary_switches=6,
                read_bytes=7,
                write_bytes=100 + 8,
            )
        },
        tracked=(1, 3),
    ),
    Row(
        "a thread that exits between passes loses its last interval; the process still counts",
        300 * SEC,
        [
            proc(
                20,
                1_000,
                300 * SEC,
                threads=[
                    thread(20, 1_000, cpu=16, vol=1),
                    thread(22, 15_000, 1_002, 4, 5, 6, 7, 8),
                ],
            )
        ],
        deltas={20: dict(processes=1, observed_nanos=100 * SEC, on_cpu_nanos=1 + 2)},
        tracked=(1, 2),
    ),
    Row(
        "a thread whose counter fell is dropped alone; one that started before the previous "
        "listing but was never seen yields nothing; the rest of the process counts",
        400 * SEC,
        [
            proc(
                20,
                1_000,
                400 * SEC,
                user=3,
                threads=[
                    thread(20, 1_000, cpu=20, vol=2),
                    thread(22, 15_000, cpu=2_000, delay=3, vol=5, invol=6, rd=7, wr=8),
                    thread(23, 29_000, cpu=500),
                ],
            )
        ],
        deltas={
            20: dict(
                processes=1,
                observed_nanos=100 * SEC,
                on_cpu_nanos=4,
                voluntary_switches=1,
                cpu_user_nanos=3 * TICK_NS,
            )
        },
        threads_refused={"counter_fell": 1, "first_seen": 1},
        tracked=(1, 3),
    ),
    Row(
        "a TID reused inside the process (new start time, born before the previous listing)",
        500 * SEC,
        [
            proc(
                20,
                1_000,
                500 * SEC,
                user=3,
                threads=[thread(20, 1_000, cpu=20, vol=2), thread(23, 35_000, cpu=1)],
            )
        ],
        deltas={20: dict(processes=1, observed_nanos=100 * SEC)},
        threads_refused={"pid_reused": 1},
        tracked=(1, 2),
    ),
]

BIRTHS = [
    Row(
        "a process already running at the first pass: no delta",
        100 * SEC,
        [proc(30, 9_000, 100 * SEC + 1, user=1)],
        deltas={},
        refused={"first_seen": 1},
    ),
    Row(
        "born after the previous listing, never seen before: whole counters",
        200 * SEC,
        [
            proc(30, 9_000, 200 * SEC, user=2),
            proc(31, 10_001, 200 * SEC, user=4, system=1, threads=[thread(31, 10_001, cpu=50)]),
        ],
        deltas={
            30: dict(processes=1, observed_nanos=100 * SEC - 1, cpu_user_nanos=TICK_NS),
            31: dict(
                processes=1,
                observed_nanos=200 * SEC - 10_001 * TICK_NS,
                on_cpu_nanos=50,
                cpu_user_nanos=4 * TICK_NS,
                cpu_system_nanos=TICK_NS,
            ),
        },
    ),
    Row(
        "started exactly at the previous listing instant: not provably new, no delta",
        300 * SEC,
        [proc(32, 20_000, 300 * SEC, user=4)],
        deltas={},
        refused={"first_seen": 1},
        tracked=(1, 1),
    ),
]


@pytest.mark.parametrize("table", [LIFE_OF_A_PID, THREADS, BIRTHS], ids=["pid", "threads", "birth"])
def test_guard_table(table):
    tracker = Tracker(HZ)
    for number, row in enumerate(table, 1):
        result = tracker.advance(row.readings, row.listed_at)
        got = {
            d.reading.pid: {k: v for k, v in d.fields.as_dict().items() if v} for d in result.deltas
        }
        assert got == row.deltas, f"pass {number}: {row.why}"
        assert result.refused == Counter(row.refused), f"pass {number}: {row.why}"
        assert result.threads_refused == Counter(row.threads_refused), f"pass {number}: {row.why}"
        if row.tracked is not None:
            assert (tracker.tracked_processes, tracker.tracked_threads) == row.tracked, row.why


def test_refused_process_still_caches_its_threads():
    """A process-level refusal gives nothing, but its threads are cached for the next pass."""
    tracker = Tracker(HZ)
    tracker.advance([proc(40, 100, SEC, faults=5, threads=[thread(40, 100, cpu=1)])], SEC)
    tracker.advance([proc(40, 100, 2 * SEC, faults=6, threads=[thread(40, 100, cpu=2)])], 2 * SEC)
    fell = tracker.advance(
        [proc(40, 100, 3 * SEC, faults=1, threads=[thread(40, 100, cpu=30)])], 3 * SEC
    )
    assert fell.deltas == [] and fell.refused == Counter(counter_fell=1)
    after = tracker.advance(
        [proc(40, 100, 4 * SEC, faults=2, threads=[thread(40, 100, cpu=34)])], 4 * SEC
    )
    assert [d.fields.on_cpu_nanos for d in after.deltas] == [4]
    assert [d.fields.major_faults for d in after.deltas] == [1]


def test_birth_never_yields_negative_observed_time():
    """A start time after the reading instant (impossible on a sane host) is not a birth."""
    tracker = Tracker(HZ)
    tracker.advance([], SEC)
    result = tracker.advance([proc(50, 500, 2 * SEC)], 2 * SEC)
    assert result.deltas == [] and result.refused == Counter(first_seen=1)


def test_carried_processes_are_summed_by_cgroup_and_others_guarded_as_usual():
    """`advance(..., carried=...)`: a reading the reader carried (last pass's very
    reading) adds one process and its observed time to its cgroup's block; one that is not
    such a continuation — even one equal to it — goes through the usual guard."""
    tracker = Tracker(HZ)
    a = proc(10, start=5_000, at=100 * SEC, user=3)
    b = proc(20, start=5_000, at=100 * SEC, user=3)
    b = b._replace(cgroup=b"0::/other\n")
    tracker.advance([a, b, proc(30, 5_000, 100 * SEC), proc(40, 5_000, 100 * SEC)], 100 * SEC)
    # pass 2: 10 and 20 carried at 160 s; 30 too, but its user time moved; 40's reading
    # is an equal copy, not the reading itself: neither is a carry
    copy = proc(40, 5_000, 100 * SEC)
    blocks = carry(a, b, proc(30, 5_000, 160 * SEC, user=2), copy)
    outcome = tracker.advance([], 160 * SEC, blocks, 160 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 60 * SEC], b"0::/other\n": [1, 60 * SEC]}
    thirty, forty = outcome.deltas  # guarded: a moved stat, and a copy with nothing moved
    assert thirty.reading.pid == 30 and thirty.fields.cpu_user_nanos == 2 * TICK_NS
    assert forty.reading.pid == 40 and forty.fields.observed_nanos == 0
    assert tracker.tracked_processes == 4
    # pass 3: carried again, from the carried readings' instant
    outcome = tracker.advance([], 200 * SEC, carry(a), 200 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 40 * SEC]}
    assert tracker.tracked_processes == 1  # the others were not seen


def test_a_reading_carried_as_it_was_stands_for_the_instant_it_was_carried():
    """The reader carries a quiet cgroup's processes as last pass's very readings, with
    one instant for all (`carried_at_ns`): observed time runs from the instant each last
    stood for — a read, or a carry — never from a reading's own older `at_ns`."""
    tracker = Tracker(HZ)
    a = proc(10, start=5_000, at=100 * SEC, user=3)
    tracker.advance([a], 100 * SEC)
    block = carry(a)
    assert carried(tracker.advance([], 160 * SEC, block, 160 * SEC)) == {b"0::/\n": [1, 60 * SEC]}
    assert carried(tracker.advance([], 200 * SEC, block, 200 * SEC)) == {b"0::/\n": [1, 40 * SEC]}
    # read again (it ran): its interval starts at the last carry, not at its reading's 100 s
    ran = proc(10, start=5_000, at=250 * SEC, user=5)
    (delta,) = tracker.advance([ran], 250 * SEC).deltas
    assert delta.fields.observed_nanos == 50 * SEC and delta.fields.cpu_user_nanos == 2 * TICK_NS
    # a carry that would run backwards is refused, never a negative interval: as the very
    # block carried last pass, and as a new block
    block = carry(ran)
    tracker.advance([], 300 * SEC, block, 300 * SEC)
    outcome = tracker.advance([], 290 * SEC, block, 290 * SEC)
    assert carried(outcome) == {} and outcome.refused == Counter(counter_fell=1)
    tracker.advance([], 300 * SEC, carry(ran), 300 * SEC)
    outcome = tracker.advance([], 290 * SEC, carry(ran), 290 * SEC)
    assert carried(outcome) == {} and outcome.refused == Counter(counter_fell=1)
    with pytest.raises(ValueError):
        tracker.advance([], 400 * SEC, carry(ran))


def test_a_block_carried_again_is_summed_whole_and_a_process_leaving_it_counts_from_it():
    """The very block carried last pass, given again, is summed as a whole: its processes
    times the span since its instant. A process of it read later (it ran) counts from the
    block's last instant; the rest, carried as a new block, are checked one by one and
    count from there too."""
    tracker = Tracker(HZ)
    a, b = proc(10, 5_000, 100 * SEC, user=3), proc(20, 5_000, 120 * SEC, user=1)
    tracker.advance([a, b], 120 * SEC)
    block = carry(a, b)
    # joined one by one: each from its own last instant
    assert carried(tracker.advance([], 160 * SEC, block, 160 * SEC)) == {b"0::/\n": [2, 100 * SEC]}
    assert carried(tracker.advance([], 200 * SEC, block, 200 * SEC)) == {b"0::/\n": [2, 80 * SEC]}
    ran = proc(10, 5_000, 250 * SEC, user=5)
    outcome = tracker.advance([ran], 250 * SEC, carry(b), 250 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 50 * SEC]}
    (delta,) = outcome.deltas
    assert delta.fields.observed_nanos == 50 * SEC and delta.fields.cpu_user_nanos == 2 * TICK_NS
    assert tracker.tracked_processes == 2


def test_a_changed_block_is_checked_process_by_process():
    """A block that is not the very one carried last pass — a process joined it — is
    checked reading by reading: one that is not the cached reading is guarded as read,
    never summed as a carry with the block's span."""
    tracker = Tracker(HZ)
    a, c = proc(10, 5_000, 100 * SEC), proc(30, 5_000, 100 * SEC, user=1)
    tracker.advance([a, c], 100 * SEC)
    outcome = tracker.advance([], 160 * SEC, carry(a), 160 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 60 * SEC]}
    moved = proc(30, 5_000, 200 * SEC, user=4)  # not 30's cached reading (it was not seen)
    outcome = tracker.advance([], 200 * SEC, carry(a, moved), 200 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 40 * SEC]}
    assert [d.reading.pid for d in outcome.deltas] == [] and outcome.refused == Counter(
        first_seen=1
    )


def test_a_block_keeping_a_process_under_another_reading_is_not_summed_as_a_carry():
    """A block of the same cgroup whose process is given with a reading other than the
    one accepted last pass (its counters moved) is no continuation: that reading is
    guarded as read, and only the processes whose very readings stand are carried."""
    tracker = Tracker(HZ)
    a, b = proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC)
    tracker.advance([a, b], 100 * SEC)
    tracker.advance([], 160 * SEC, carry(a, b), 160 * SEC)
    moved = proc(10, 5_000, 200 * SEC, user=4)
    outcome = tracker.advance([], 200 * SEC, carry(moved, b), 200 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 40 * SEC]}
    (delta,) = outcome.deltas
    assert delta.reading is moved and delta.fields.cpu_user_nanos == 4 * TICK_NS
    assert delta.fields.observed_nanos == 40 * SEC


def test_a_pass_that_fails_midway_leaves_the_cache_as_it_was():
    """The cache is changed in place; a pass that raises midway — after a block was
    carried again (its instant moved), a process left it and another joined it, and
    processes were read — puts back all it changed. The tracker then is, and guards the
    next pass, as one that never saw the failed pass."""
    failed, never = Tracker(HZ), Tracker(HZ)
    a, b, c, d = (proc(pid, 5_000, 100 * SEC) for pid in (10, 20, 30, 40))
    c2, d2 = (proc(pid, 5_000, 160 * SEC, user=2) for pid in (30, 40))
    block = carry(a, b)
    for tracker in (failed, never):
        tracker.advance([a, b, c, d], 100 * SEC)
        tracker.advance([c2, d2], 160 * SEC, block, 160 * SEC)

    def state(tracker: Tracker):
        cells = {pid: (at.ns, id(at)) for pid, at in tracker._since.items()}
        shared = {frozenset(p for p in cells if cells[p][1] == i) for _, i in cells.values()}
        blocks = {c: (id(members), at.ns) for c, (members, at) in tracker._blocks.items()}
        return (
            dict(tracker._cache),
            {p: ns for p, (ns, _) in cells.items()},
            shared,
            blocks,
            tracker.previous_listing_ns,
        )

    before = state(failed)

    read_then_fail = [
        proc(40, 5_000, 200 * SEC, user=4),  # d ran again: read
        proc(20, 5_000, 200 * SEC, user=5),  # b ran: read, and left the block
        proc(50, 5_000, 200 * SEC)._replace(threads=None),  # one the guard cannot take
    ]
    with pytest.raises(TypeError):  # a stays, c joins with its cached reading, b leaves
        failed.advance(read_then_fail, 200 * SEC, carry(a, c2), 200 * SEC)
    assert state(failed) == before == state(never)
    last = [proc(30, 5_000, 250 * SEC, user=3), proc(40, 5_000, 250 * SEC, user=6)]
    after = [t.advance(last, 250 * SEC, block, 250 * SEC) for t in (failed, never)]
    assert after[0] == after[1]
    assert carried(after[0]) == {b"0::/\n": [2, 2 * 90 * SEC]}
    assert [delta.fields.observed_nanos for delta in after[0].deltas] == [90 * SEC] * 2
    assert state(failed) == state(never)


def test_a_block_of_a_failed_pass_is_not_kept():
    """The blocks a failed pass was given are not kept: given again as the very object,
    a block counts each of its processes from the last pass that completed."""
    tracker = Tracker(HZ)
    a = proc(10, 5_000, 100 * SEC)
    tracker.advance([a], 100 * SEC)
    block = carry(a)
    broken = proc(50, 5_000, 200 * SEC)._replace(threads=None)
    with pytest.raises(TypeError):
        tracker.advance([broken], 200 * SEC, block, 200 * SEC)
    assert carried(tracker.advance([], 300 * SEC, block, 300 * SEC)) == {b"0::/\n": [1, 200 * SEC]}


def test_readings_given_as_an_iterator_are_all_guarded_and_kept():
    """`advance` takes any iterable of readings: an iterator is read once, and every
    reading in it is both guarded and kept for the next pass."""
    tracker = Tracker(HZ)
    tracker.advance(iter([proc(10, 5_000, 100 * SEC)]), 100 * SEC)
    outcome = tracker.advance(iter([proc(10, 5_000, 160 * SEC, user=3)]), 160 * SEC)
    (delta,) = outcome.deltas
    assert delta.fields.observed_nanos == 60 * SEC and not outcome.refused


def test_a_process_refused_from_a_block_is_not_kept_in_it():
    """A carried reading that is no continuation (not the cached one) is guarded as read
    and left out of the block the tracker keeps: the next pass, given the very block
    again, counts it from its own reading, not from the block's instant."""
    tracker = Tracker(HZ)
    a, x = proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC)
    tracker.advance([a, x], 100 * SEC)
    x2 = proc(20, 5_000, 150 * SEC)  # read by a pass the guard never saw
    block = carry(a, x2)
    outcome = tracker.advance([], 160 * SEC, block, 160 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 60 * SEC]}
    (delta,) = outcome.deltas
    assert delta.reading is x2 and delta.fields.observed_nanos == 50 * SEC
    outcome = tracker.advance([], 200 * SEC, block, 200 * SEC)
    assert carried(outcome) == {b"0::/\n": [2, 40 * SEC + 50 * SEC]}


def test_nothing_is_kept_of_a_process_gone_from_a_block():
    """A process that exits while carried in a block leaves nothing behind: what the
    tracker keeps per PID is bounded by the process table."""
    tracker = Tracker(HZ)
    a, b = proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC)
    tracker.advance([a, b], 100 * SEC)
    tracker.advance([], 160 * SEC, carry(a, b), 160 * SEC)
    assert tracker._since.keys() == {10, 20}
    tracker.advance([], 200 * SEC, carry(a), 200 * SEC)  # b exited
    assert tracker._cache.keys() == tracker._since.keys() == {10}
    tracker.advance([proc(10, 5_000, 250 * SEC, user=1)], 250 * SEC)
    assert tracker._cache.keys() == {10} and not tracker._since


def test_each_block_given_is_one_carried_delta_holding_the_readers_block():
    """Every block the reader gives comes back as one `CarriedDelta` holding it (its
    footprint sums are the reader's): accepted whole, its very mapping of readings; with
    members refused, those left out (they are guarded as read); with every one refused,
    none, and no block kept to continue from."""
    tracker = Tracker(HZ)
    a, b = proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC)
    other = proc(30, 5_000, 100 * SEC)._replace(cgroup=b"0::/other\n")
    tracker.advance([a, b, other], 100 * SEC)
    whole, stranger = carry(a, b)[0], carry(proc(30, 5_000, 100 * SEC, user=1))[0]
    stranger = stranger._replace(cgroup=other.cgroup)
    outcome = tracker.advance([], 160 * SEC, [whole, stranger], 160 * SEC)
    first, second = outcome.carried
    assert first.block is whole and first.readings is whole.readings
    assert first.cgroup == whole.cgroup and first.observed_ns == 2 * 60 * SEC
    assert second.block is stranger and second.readings == {} and second.observed_ns == 0
    assert [d.reading.pid for d in outcome.deltas] == [30]
    assert tracker._blocks.keys() == {whole.cgroup}
    part = carry(a, proc(20, 5_000, 200 * SEC, user=1))[0]  # 20 ran: not last pass's reading
    (only,) = tracker.advance([], 200 * SEC, [part], 200 * SEC).carried
    assert only.readings == {10: a} and only.observed_ns == 40 * SEC


@pytest.mark.parametrize("counter", ["cpu", "delay", "vol", "invol", "rd", "wr"])
def test_a_thread_whose_any_counter_fell_is_refused_whole(counter):
    """Each of a thread's six counters is checked on its own: one that fell (the others
    rose) refuses the thread, counted as counter_fell, and none of its deltas is summed;
    its sibling still counts."""
    tracker = Tracker(HZ)
    before = dict(cpu=10, delay=10, vol=10, invol=10, rd=10, wr=10)
    after = {name: 5 if name == counter else 20 for name in before}
    sibling = thread(21, 1_000, cpu=1)
    tracker.advance([proc(20, 1_000, 100 * SEC, threads=[thread(20, 1_000, **before), sibling])],
                    100 * SEC)  # fmt: skip
    moved = [thread(20, 1_000, **after), thread(21, 1_000, cpu=4)]
    outcome = tracker.advance([proc(20, 1_000, 200 * SEC, threads=moved)], 200 * SEC)
    (delta,) = outcome.deltas
    assert outcome.threads_refused == Counter(counter_fell=1)
    assert delta.fields.on_cpu_nanos == 3
    assert (delta.fields.run_delay_nanos, delta.fields.voluntary_switches,
            delta.fields.nonvoluntary_switches, delta.fields.read_bytes,
            delta.fields.write_bytes) == (0, 0, 0, 0, 0)  # fmt: skip


def test_a_carry_refused_for_running_backwards_leaves_the_rest_of_its_block_carried():
    """A block carried at 220 s of a process read at 250 s (its time would run backwards:
    guarded as read) and one read at 200 s: the second is still carried, 20 s observed."""
    tracker = Tracker(HZ)
    tracker.advance([proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC)], 100 * SEC)
    ahead, behind = proc(10, 5_000, 250 * SEC), proc(20, 5_000, 200 * SEC)
    tracker.advance([ahead, behind], 200 * SEC)
    outcome = tracker.advance([], 220 * SEC, carry(ahead, behind), 220 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 20 * SEC]}
    assert [d.reading.pid for d in outcome.deltas] == [10]


def test_a_thread_is_paired_with_its_last_reading_by_tid_not_by_a_start_equal_to_it():
    """Thread 4999 gone, thread 5000 new in its place, both started in tick 5000: the new
    thread's TID is the old one's start. It is no continuation of the old thread: first
    seen, its counters not summed."""
    tracker = Tracker(HZ)
    tracker.advance([proc(10, 5_000, 100 * SEC,
                          threads=[thread(10, 5_000), thread(4999, 5_000, cpu=SEC)])],
                    100 * SEC)  # fmt: skip
    outcome = tracker.advance([proc(10, 5_000, 200 * SEC,
                                    threads=[thread(10, 5_000), thread(5000, 5_000, cpu=3 * SEC)])],
                              200 * SEC)  # fmt: skip
    (delta,) = outcome.deltas
    assert delta.fields.on_cpu_nanos == 0 and outcome.threads_refused == Counter(first_seen=1)

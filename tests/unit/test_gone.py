"""Processes born and gone, counted by parent (collector/gone.py): a pass that takes their
records that way gives the very sums, outcomes and deferrals that `Tracker.close` gives
taking each one by one, over random passes of records in the fixture's world (tests/
fixturetree.py): children of its processes, chains of short-lived parents in either order,
PIDs taken again, unknown parents and init, threads of born processes, records too late or
begun before the last pass."""

from __future__ import annotations

import random

import pytest

from collector.exits import ExitRecords, pack_stats
from collector.gone import GoneByParent
from collector.lineage import MAX_DEPTH, Life
from tests.exitrecords import taskstats
from tests.unit.test_engine_exits import engine_after_a_pass, group_of
from tests.unit.test_tracker import SEC

# the fixture's processes: 600 gone since the first pass, 700 begun since (at 1007 s)
HELD = (100, 200, 300, 400, 500, 501, 600, 700, 900, 950, 1000, 1100)
SEEDS = range(40)


def _stats(rng: random.Random, pid: int, tgid: int, ppid: int, start: int, at: int,
           last: bool = True, group_start: int | None = None) -> dict:  # fmt: skip
    return dict(
        pid=pid, tgid=tgid, ppid=ppid, last=last,
        lived_us=(at - start) // 1000,
        group_lived_us=(at - (start if group_start is None else group_start)) // 1000,
        on_cpu=rng.randrange(10**9), delay=rng.randrange(10**7), vol=rng.randrange(100),
        invol=rng.randrange(100), rd=rng.randrange(1 << 20), wr=rng.randrange(1 << 20),
        utime_us=rng.randrange(10**6), stime_us=rng.randrange(10**6), majflt=rng.randrange(9),
    )  # fmt: skip


def records_of(seed: int) -> list[tuple[dict, int, int]]:
    """A random pass's records, in the order they came: (taskstats' arguments, arrival, wait)."""
    rng = random.Random(seed)
    pids = iter(rng.sample(range(60000, 70000), 2000))
    came: list[tuple[dict, int, int]] = []

    def at() -> int:
        return 1010 * SEC + rng.randrange(SEC // 2)

    def waited() -> int:
        return rng.choice((0, 0, 0, 0, rng.randrange(2 * 10**8), rng.randrange(10**6), 3 * SEC))

    def start(low: float = 1000.5, high: float = 1010.0) -> int:
        return int(rng.uniform(low, high) * SEC)

    for _ in range(rng.randrange(20, 80)):
        shape = rng.random()
        if shape < 0.35:  # a child of a process the passes read, or of none known
            earlier = [came[-1][0]["pid"]] if came else []  # a process gone, or a thread
            ppid = rng.choice((*HELD, *HELD, 1, 99999, *earlier))
            pid = next(pids)
            came.append((_stats(rng, pid, pid, ppid, start(999, 1010), at()), at(), waited()))
        elif shape < 0.7:  # a short-lived parent and its children, its record after or before
            parent, began, gone = next(pids), start(1001, 1005), at()
            children = []
            for _ in range(rng.randrange(1, 6)):
                pid = next(pids)
                child_at = rng.randrange(began, gone)
                children.append(
                    (_stats(rng, pid, pid, parent, rng.randrange(began, child_at), child_at),
                     child_at, waited())
                )  # fmt: skip
            own = (_stats(rng, parent, parent, rng.choice(HELD), began, gone), gone, waited())
            came += [*children, own] if rng.random() < 0.8 else [own, *children]
        elif shape < 0.85:  # a born process's threads, then its last task
            tgid, began = next(pids), start(1002, 1008)
            ppid = rng.choice(HELD)
            for _ in range(rng.randrange(1, 4)):
                tid = next(pids)
                gone = at()
                came.append(
                    (_stats(rng, tid, tgid, ppid, rng.randrange(began, gone), gone, last=False,
                            group_start=began), gone, waited())
                )  # fmt: skip
            gone = at()
            came.append((_stats(rng, tgid, tgid, ppid, began, gone), gone, waited()))
        else:  # a held process's last record, or one begun before the last pass
            pid = rng.choice((*HELD, next(pids)))
            came.append((_stats(rng, pid, pid, rng.choice(HELD), start(990, 1001), at()),
                         at(), waited()))  # fmt: skip
    return came


def passes(seed: int | list[tuple[dict, int, int]], by_parent: bool) -> tuple[list, int]:
    """Two passes over a seed's records, or these (the second places what the first
    deferred): what each gave, and how many records `Tracker.close` was given."""
    engine = engine_after_a_pass()
    if not by_parent:
        engine.tracker.unread_process = lambda slept_ns=None: None
    given = 0
    close = engine.tracker.close

    def counting(records, **kw):
        def each():
            nonlocal given
            for record in records:
                given += 1
                yield record

        return close(each(), **kw)

    engine.tracker.close = counting
    engine.exits.queue += [
        pack_stats(taskstats(**stats), received, wait)
        for stats, received, wait in (records_of(seed) if isinstance(seed, int) else seed)
    ]
    results = [engine.run_pass() for _ in range(2)]
    pending = dict(engine.tracker._pending)
    return [
        (dict(r.intervals), r.exits_unplaced, r.exits, pending, len(engine._deferred))
        for r in results
    ], given


@pytest.mark.parametrize("seed", SEEDS)
def test_by_parent_the_pass_gives_what_closing_each_record_gives(seed):
    quick, given_quick = passes(seed, by_parent=True)
    slow, given_slow = passes(seed, by_parent=False)
    assert quick == slow
    assert given_quick < given_slow


def test_a_chain_longer_than_the_lineage_follows_is_unplaced_either_way():
    """A chain of short-lived processes under 200, each begun after its parent and gone
    before it: its deepest past `MAX_DEPTH` ancestors are unplaced, by parent as one by one."""
    rng = random.Random(7)
    chain, ppid = [], 200
    for depth in range(MAX_DEPTH + 3):
        pid, began, gone = 62000 + depth, 1001 * SEC + depth * 10**7, 1010 * SEC - depth * 10**6
        chain.append((_stats(rng, pid, pid, ppid, began, gone), gone, 0))
        ppid = pid
    quick, _ = passes(chain[::-1], by_parent=True)  # the deepest first, as they end
    slow, _ = passes(chain[::-1], by_parent=False)
    assert quick == slow
    assert quick[0][2] == {"born": MAX_DEPTH + 3, "unplaced": 3}  # 64, 65 and 66 deep


def test_most_born_and_gone_processes_are_taken_by_parent():
    """Over every seed, most records go by parent: the test above compares that way."""
    quick = slow = 0
    for seed in SEEDS[:10]:
        quick += passes(seed, by_parent=True)[1]
        slow += passes(seed, by_parent=False)[1]
    assert quick < slow * 0.7


def test_a_child_of_a_held_process_counts_there_with_its_process_fields():
    engine = engine_after_a_pass()
    at = 1010 * SEC + SEC // 2
    stats = taskstats(61000, 61000, ppid=200, lived_us=2 * 10**6, on_cpu=7_000_001,
                      utime_us=3000, stime_us=1000, majflt=2)  # fmt: skip
    engine.exits.queue += [pack_stats(stats, at), pack_stats(stats, at + 1)]
    result = engine.run_pass()
    pod = result.intervals[group_of(engine, 200)]
    assert result.exits == {"born": 2}
    assert pod.on_cpu_nanos % 10**6 == 2  # twice 7,000,001, and 200's own whole ms
    assert pod.cpu_user_nanos % 10**7 == 6_000_000 and pod.cpu_system_nanos % 10**7 == 2_000_000
    assert pod.major_faults >= 4


def by_parent(*parents: int) -> GoneByParent:
    """Every record cleared as unread; each of `parents` a process read, in cgroup `0::/pod`."""
    lives = {pid: [Life(0, 1, None, None, b"0::/pod", 1)] for pid in parents}
    return GoneByParent(
        lambda tgid, earliest: True, lambda pid: lives.get(pid, []), lambda pid: iter(())
    )


def born(count: int, ppid: int) -> ExitRecords:
    return ExitRecords(
        b"".join(
            pack_stats(taskstats(60000 + i, ppid=ppid, lived_us=1000, on_cpu=1), 10 * SEC)
            for i in range(count)
        )
    )


def test_rows_of_one_cgroup_are_summed_as_they_pile_up():
    """Past `_FOLD_ROWS` records of one cgroup, the rows held are summed into one."""
    gone = by_parent(200)
    assert list(gone.others(born(1500, 200))) == []
    assert len(gone._rows[b"0::/pod"]) < 512
    [(cgroup, fields)] = list(gone.sums())
    assert cgroup == b"0::/pod" and fields.processes == 1500 and fields.on_cpu_nanos == 1500
    assert fields.observed_nanos == 1500 * 10**6


def test_init_read_by_a_pass_is_still_no_parent():
    """PID 1 reaps orphans begun anywhere (`ancestor_cgroup`): its children go to `close`."""
    gone = by_parent(1, 200)
    assert [r.pid for r in gone.others(born(2, 1))] == [60000, 60001]
    assert list(gone.sums()) == []


@pytest.mark.parametrize("before", [True, False])
def test_a_child_begun_before_its_parent_pids_holder_is_never_that_ones(before):
    """700 began at 1007 s (the fixture's second pass reads it): a child naming 700 that
    began 1 ms before is another's (a PID taken again), counted nowhere yet; 1 ms after, 700's."""
    at = 1010 * SEC
    began = 1007 * SEC + (-1 if before else 1) * 10**6
    stats = taskstats(61000, ppid=700, lived_us=(at - began) // 1000, on_cpu=7_000_001)
    on_cpu = {}
    for given in ([], [pack_stats(stats, at)]):
        engine = engine_after_a_pass()
        engine.exits.queue += given
        result = engine.run_pass()
        on_cpu[bool(given)] = result.intervals[group_of(engine, 700)].on_cpu_nanos
        assert result.exits_unplaced.on_cpu_nanos == 0
    assert on_cpu[True] - on_cpu[False] == (0 if before else 7_000_001)

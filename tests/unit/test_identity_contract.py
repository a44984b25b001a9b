"""The identity contract between the incremental reader and the guard, clause by clause
(collector/readings.py states it): what was not read again is handed back as the very
object; a block that stands is the very mapping, given back by the guard; identity only
saves work and never decides a delta."""

from __future__ import annotations

import operator

from collector.model import Fields
from collector.readings import Carried
from collector.tracker import Advance, Tracker
from tests.fixturetree import ScriptedClock
from tests.unit.test_quiet_cgroups import IDLE_A, IDLE_A2, IDLE_S, SECOND, Node, run_b
from tests.unit.test_tracker import HZ, SEC, carried, carry, proc


class Watching:
    """The engine's guard, keeping each pass's outcome."""

    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self.outcomes: list[Advance] = []
        advance = tracker.advance

        def watched(*args, **kwargs) -> Advance:
            self.outcomes.append(advance(*args, **kwargs))
            return self.outcomes[-1]

        tracker.advance = watched  # type: ignore[method-assign]


def quiet_node(tmp_path, passes: int):
    """The fixture node of tests/unit/test_quiet_cgroups.py (two idle groups, one that runs)
    through `passes` passes of an engine that takes the shortcut."""
    node = Node(tmp_path)
    engine, _ = node.engine(True, ScriptedClock())
    watching = Watching(engine.tracker)
    for step in range(passes):
        run_b(node, step)
        node.write()
        engine.run_pass()
    return engine, watching


def blocks(engine) -> dict[bytes, Carried]:
    return {block.cgroup: block for block in engine.reader.last.carried}


def test_identity_clause_1_what_was_not_read_again_is_the_guards_very_reading(tmp_path):
    """A carried process is handed to the guard as the very `ProcessReading` the guard
    holds (not an equal copy), threads and all, and the guard accepts it as carried."""
    engine, watching = quiet_node(tmp_path, 4)
    carried = blocks(engine)
    members = {pid: r for block in carried.values() for pid, r in block.readings.items()}
    assert set(members) == {IDLE_A, IDLE_A2, IDLE_S}
    cache = engine.tracker._cache
    for pid, reading in members.items():
        assert reading is cache[pid], pid
    assert {t.tid for t in members[IDLE_A].threads} == {IDLE_A, SECOND}
    accepted = {pid for kept in watching.outcomes[-1].carried for pid in kept.readings}
    assert accepted == set(members)
    assert not {d.reading.pid for d in watching.outcomes[-1].deltas} & set(members)


def test_identity_clause_1_an_idle_processs_threads_are_the_very_readings(tmp_path):
    """Read (no cgroup shortcut taken), a process whose threads did not run is a new
    reading whose threads are the very `ThreadReading`s, in the very tuple, of the pass
    before: the guard's zero delta for them is one `is`."""
    node = Node(tmp_path)
    engine, _ = node.engine(True, ScriptedClock())
    engine.carry_quiet = False
    before = None
    for step in range(3):
        run_b(node, step)
        node.write()
        engine.run_pass()
        (now,) = (r for r in engine.reader.last.processes if r.pid == IDLE_A)
        assert now is engine.tracker._cache[IDLE_A]
        if before is not None:
            assert all(map(operator.is_, now.threads, before.threads))
        before = now
    assert not engine.reader.last.carried
    assert now.threads is engine.tracker._cache[IDLE_A].threads


def test_identity_clause_2_a_block_that_stands_is_the_very_mapping_given_back(tmp_path):
    """Pass after pass, a quiet cgroup's block is the very mapping of the pass before, and
    the guard, accepting every member, gives back that very mapping: O(1) in the guard
    and the sums."""
    engine, watching = quiet_node(tmp_path, 4)
    before = {cgroup: block.readings for cgroup, block in blocks(engine).items()}
    assert before
    engine.run_pass()
    after = blocks(engine)
    for cgroup, readings in before.items():
        assert after[cgroup].readings is readings, cgroup
    for kept in watching.outcomes[-1].carried:
        assert kept.readings is kept.block.readings, kept.cgroup


def test_identity_clause_3_an_equal_copy_goes_the_long_way_and_no_delta_is_wrong():
    """A carried member equal to the cached reading but not the same object is refused from
    the block and guarded as read: a zero delta, nothing counted twice. Its instant being
    the cached one's, its process-time observed is not lost but counted at its next carry,
    from that instant: over the passes, the sums a carry of the very reading gives."""
    tracker = Tracker(HZ)
    a, b = proc(10, 5_000, 100 * SEC), proc(20, 5_000, 100 * SEC, user=3)
    tracker.advance([a, b], 100 * SEC)
    copy = a._replace(threads=tuple(list(a.threads)))
    assert copy == a and copy is not a
    outcome = tracker.advance([], 160 * SEC, carry(copy, b), 160 * SEC)
    assert carried(outcome) == {b"0::/\n": [1, 60 * SEC]}  # b alone, as carried
    (delta,) = outcome.deltas  # the copy, guarded as read
    assert delta.reading is copy and delta.fields == Fields(processes=1)
    assert not outcome.refused
    outcome = tracker.advance([], 200 * SEC, carry(copy, b), 200 * SEC)
    assert carried(outcome) == {b"0::/\n": [2, 40 * SEC + 100 * SEC]}  # a: since 100 s
    assert outcome.deltas == []

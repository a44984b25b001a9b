"""The engine's own duties around a pass (the pass itself is tested through its layers)."""

import gc

import pytest

from tests.fixturetree import FixtureRun


class Watching:
    """A reader stand-in that records whether the garbage collector ran during a read."""

    def __init__(self, reader, fail: bool = False):
        self.reader = reader
        self.fail = fail
        self.collector_enabled: list[bool] = []

    def read_pass(self, quiet=None):
        self.collector_enabled.append(gc.isenabled())
        if self.fail:
            raise OSError("proc root gone")
        return self.reader.read_pass(quiet)


def test_the_garbage_collector_is_held_off_for_a_pass_and_back_after():
    run = FixtureRun()
    watching = run.engine.reader = Watching(run.engine.reader)
    assert gc.isenabled()
    run.engine.run_pass()
    assert watching.collector_enabled == [False]
    assert gc.isenabled()

    watching.fail = True
    with pytest.raises(OSError):
        run.engine.run_pass()
    assert watching.collector_enabled == [False, False]
    assert gc.isenabled(), "a failed pass gives the collector back too"


class _Cycle:
    """Cyclic garbage: freed by the cyclic collector only."""

    def __init__(self):
        self.me = self


def test_a_serving_engine_freezes_what_a_pass_leaves_and_sweeps_every_so_often():
    """With `freeze_gc` (serve), what the process holds after a pass is frozen, so that
    the collector never scans the cache; every `GC_SWEEP_PASSES` passes all of it is
    handed back and collected, so cyclic garbage frozen meanwhile is freed then. Without
    it (the default, as in `once` and in tests), nothing is frozen."""
    import weakref

    from collector.engine import GC_SWEEP_PASSES

    gc.collect()
    gc.unfreeze()
    try:
        run = FixtureRun()
        run.engine.run_pass()
        assert gc.get_freeze_count() == 0

        run.engine.freeze_gc = True
        run.engine.passes = 0
        run.engine.run_pass()
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        garbage = _Cycle()
        gone = weakref.ref(garbage)
        del garbage
        for _ in range(GC_SWEEP_PASSES - 2):
            run.engine.run_pass()
            gc.collect()  # a frozen object is never scanned, even by a full collection
            assert gone() is not None
        run.engine.run_pass()  # the sweep: unfrozen, collected, frozen again
        assert gone() is None
        assert gc.get_freeze_count() > 0 and gc.isenabled()
    finally:
        gc.unfreeze()

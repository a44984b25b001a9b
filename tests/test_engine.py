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

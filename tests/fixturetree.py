"""The literal fixture proc tree (tests/fixtures) and a scripted clock to pass over it."""

from __future__ import annotations

from pathlib import Path

from collector.aggregate import Totals
from collector.engine import Engine
from collector.groups import Grouper, PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker

FIXTURES = Path(__file__).parent / "fixtures"
PASS1 = FIXTURES / "proc" / "pass1"
PASS2 = FIXTURES / "proc" / "pass2"
POD_LOGS = FIXTURES / "var" / "log" / "pods"
CONTAINER_LOGS = FIXTURES / "var" / "log" / "containers"
SEC = 1_000_000_000


class ScriptedClock:
    """CLOCK_BOOTTIME stand-in: starts at 1000 s, advances 1 µs per reading."""

    def __init__(self, start_ns: int = 1000 * SEC, step_ns: int = 1_000):
        self.now = start_ns
        self.step = step_ns

    def __call__(self) -> int:
        now = self.now
        self.now += self.step
        return now


class FixtureRun:
    """An engine over pass1; `sleep()` moves it to pass2 and the clock to 1010 s."""

    def __init__(self, per_container: bool = False, pods_only: bool = False):
        self.clock = ScriptedClock()
        self.procfs = ProcFS(str(PASS1))
        names = PodNames(str(POD_LOGS), str(CONTAINER_LOGS))
        self.engine = Engine(
            Reader(self.procfs, clock=self.clock, page_size=4096),
            Tracker(hz=100),
            Grouper(names, per_container=per_container, pods_only=pods_only),
            Totals(),
            wall_clock=lambda: 1_700_000_000.0,
            timer=lambda: 0.0,
        )

    def sleep(self, seconds: float) -> None:
        self.procfs.root = str(PASS2)
        self.clock.now = 1010 * SEC

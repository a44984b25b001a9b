"""The literal fixture proc tree (tests/fixtures), its cgroupfs (tests/cgroupfixture.py),
and a scripted clock to pass over them."""

from __future__ import annotations

from pathlib import Path

from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS
from collector.engine import Engine
from collector.groups import Grouper
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.sources import node_cpu
from collector.tracker import Tracker
from tests.cgroupfixture import MAIN, CgroupTree

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
    """An engine over pass1 and its cgroupfs; `sleep()` moves both to pass2 and the clock
    to 1010 s. Without `cgroups`, the cgroup fields are not collected."""

    def __init__(self, per_container: bool = False, pods_only: bool = False, cgroups: bool = True):
        self.clock = ScriptedClock()
        self.procfs = ProcFS(str(PASS1))
        self.cgroups = CgroupTree(MAIN) if cgroups else None
        names = PodNames(str(POD_LOGS), str(CONTAINER_LOGS))
        self.engine = Engine(
            Reader(self.procfs, clock=self.clock, page_size=4096),
            Tracker(hz=100),
            Grouper(names, per_container=per_container, pods_only=pods_only),
            Totals(),
            wall_clock=lambda: 1_700_000_000.0,
            timer=lambda: 0.0,
            cgroupfs=CgroupFS(str(self.cgroups.root)) if self.cgroups else None,
            node_cpu=lambda: node_cpu(self.procfs.root, 100),
        )

    def sleep(self, seconds: float) -> None:
        self.procfs.root = str(PASS2)
        if self.cgroups is not None:
            self.cgroups.next_pass()
        self.clock.now = 1010 * SEC


def every_process(readings) -> tuple:
    """A pass's processes read and carried (`PassReadings`): what a plain reader of every
    file reads."""
    return readings.processes + tuple(r for b in readings.carried for r in b.readings.values())

"""tests/machine.py: other work on the CPUs is seen as such, before a test lays its threads
out and while it measures; the test's own processes are not other work."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests import machine

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


@contextlib.contextmanager
def elsewhere(seconds: int):
    """A busy loop on each CPU for at most `seconds`, in processes that are not this one's
    descendants (orphaned at once: their parent exits), as another job's would be; in a
    process group of their own, killed on the way out."""
    spin = shlex.join([sys.executable, "-c", SPIN.format(seconds=seconds)])
    loops = "; ".join(f"({spin} &)" for _ in range(os.cpu_count() or 1))
    parent = subprocess.Popen(["sh", "-c", loops], start_new_session=True)
    parent.wait()
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def test_other_work_is_seen_before_the_test_and_said_after_it(monkeypatch):
    monkeypatch.setattr(machine, "_current", None)
    assert machine.busy_verdict() is None  # nothing laid out: nothing to judge
    with elsewhere(30):
        time.sleep(0.2)
        with pytest.raises(AssertionError, match="the machine was busy before the test"):
            machine.lay_out(seconds=1.0, patience=3.0)
        monkeypatch.setattr(machine, "_current", machine.Window())
        time.sleep(1.0)
        verdict = machine.busy_verdict()
    assert verdict is not None and verdict.startswith("THE MACHINE WAS BUSY")


def test_the_tests_own_processes_are_not_other_work():
    """A child's CPU time, reaped, is the test's own: as much as the child used of itself."""
    window = machine.Window()
    spin = SPIN.format(seconds=1) + "\nprint(time.process_time())"
    used = float(subprocess.run([sys.executable, "-c", spin], capture_output=True,
                                text=True, check=True).stdout)  # fmt: skip
    own = machine.own_seconds() - window.own
    assert own >= 0.9 * used and used > 0.1

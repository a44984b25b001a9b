"""Whether the machine gave a test the CPUs it assumed were its own.

The kernel tests that measure shares of the CPUs on live cgroups (who waited behind whom,
how much of a quota was used) lay their threads out for an idle two-CPU machine. Beside
other work on the same CPUs (another test run, a build) the shares they measure move, and a
bare assertion would blame the product. So such a test checks first that the machine is
idle (`lay_out`, before its workloads start), and a failure of a test marked `cpu_shares`
says first when other work used the CPUs meanwhile (tests/conftest.py): it still fails.

Other work is the node's busy time (`/proc/stat`: user, nice, system, irq, softirq, and
steal, the hypervisor's) less what this test process and its descendants used (psutil:
each one alive, and the children it reaped).
"""

from __future__ import annotations

import os
import time

import psutil

IDLE_BUDGET = 0.25
"""CPUs other work may use, on average, before a test lays its threads out."""
BUSY_BUDGET = 0.25
"""CPUs other work may use, on average, while the shares are measured, for a failure to be
the product's."""
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat cpu: user nice system - - irq softirq steal
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def node_busy_seconds() -> float:
    """CPU-seconds the node's CPUs have been busy since boot, steal included."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) * _TICK_S


def own_seconds() -> float:
    """CPU-seconds this process and its descendants used: each one alive, and the children
    each reaped."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone meanwhile: its parent reaped it, or will
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class Window:
    """A span of wall time: how many CPUs other work used over it, on average."""

    def __init__(self):
        self.began = time.monotonic()
        self.busy = node_busy_seconds()
        self.own = own_seconds()

    def others_cpus(self) -> float:
        elapsed = max(time.monotonic() - self.began, 1e-3)
        others = (node_busy_seconds() - self.busy) - (own_seconds() - self.own)
        return max(others, 0.0) / elapsed


_current: Window | None = None


def lay_out(seconds: float = 1.0, patience: float = 10.0) -> Window:
    """Before a test lays its threads out: a span of `seconds` in which other work used
    under IDLE_BUDGET CPUs, within `patience` seconds (what the test before left winding
    down settles), or an AssertionError that says the machine was busy; then the window its
    shares are measured over, which a failure of the test is judged against."""
    global _current
    deadline = time.monotonic() + patience
    while True:
        before = Window()
        time.sleep(seconds)
        others = before.others_cpus()
        if others <= IDLE_BUDGET:
            break
        assert time.monotonic() < deadline, (
            f"the machine was busy before the test: other work used {others:.2f} of its "
            f"{os.cpu_count()} CPUs for {patience:.0f} s (at most {IDLE_BUDGET} allowed "
            f"over {seconds:.0f} s); this test measures shares of CPUs it lays out as its own"
        )
    _current = Window()
    return _current


def busy_verdict() -> str | None:
    """Where other work used more than BUSY_BUDGET CPUs since the last `lay_out`, what to
    say before a failed test's own assertion; else None."""
    if _current is None:
        return None
    others = _current.others_cpus()
    if others <= BUSY_BUDGET:
        return None
    return (
        f"THE MACHINE WAS BUSY: other work used {others:.2f} of its {os.cpu_count()} CPUs on "
        f"average while this test measured shares of them (at most {BUSY_BUDGET} allowed): "
        "the assertion below failed on a machine that was not the test's, not on a wrong "
        "product. Run it again on an idle machine."
    )

"""Reliability on the real kernel: a reused PID, a restart, a stall, dropped privileges."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from collector.model import ticks_to_ns
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker
from tests.cgroups import cgroup
from tests.net import free_port, http_get, start_serve, wait_until

pytestmark = pytest.mark.kernel

HZ = os.sysconf("SC_CLK_TCK")
BUSY = "import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass\n"


DROP_CAPABILITIES = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]


def spawn_busy(
    seconds: float, cgroup_path: str | None = None, capabilities: bool = True
) -> subprocess.Popen:
    command = [sys.executable, "-c", BUSY.format(seconds=seconds)]
    if not capabilities:
        command = DROP_CAPABILITIES + command
    if cgroup_path is None:
        return subprocess.Popen(command)
    procs = os.path.join(cgroup_path, "cgroup.procs")
    script = f'echo $$ > "{procs}" && exec "$@"'
    return subprocess.Popen(["sh", "-c", script, "sh", *command])


def spawn_at_pid(pid: int, seconds: float, attempts: int = 300) -> subprocess.Popen:
    """A new busy process that takes `pid`, through the kernel's ns_last_pid (retried:
    other processes fork too)."""
    for _ in range(attempts):
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        process = spawn_busy(seconds)
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    raise AssertionError(f"could not get PID {pid} back in {attempts} attempts")


def test_a_reused_pid_never_mixes_two_processes():
    reader, tracker = Reader(ProcFS("/proc")), Tracker(HZ)
    old = spawn_busy(30)
    try:
        time.sleep(1.5)  # the old process accrues CPU time the new one must not inherit
        first = reader.read_pass()
        tracker.advance(first.processes, first.listed_at_ns)
        pid = old.pid
        # Start times have a tick's resolution (10 ms): let the new process start ticks
        # after this pass began listing, so that its birth is provable.
        time.sleep(0.05)
    finally:
        old.kill()
        old.wait()
    (old_reading,) = [r for r in first.processes if r.pid == pid]
    new = spawn_at_pid(pid, 30)
    try:
        time.sleep(0.3)
        second = reader.read_pass()
        advance = tracker.advance(second.processes, second.listed_at_ns)
    finally:
        new.kill()
        new.wait()
    (new_reading,) = [r for r in second.processes if r.pid == pid]
    assert new_reading.start_ticks != old_reading.start_ticks
    deltas = [d for d in advance.deltas if d.reading.pid == pid]
    # Born after the previous pass began listing: its whole counters are its own first
    # interval, never the difference from the old process's.
    assert len(deltas) == 1 and deltas[0].born
    fields = deltas[0].fields
    assert fields.cpu_user_nanos == ticks_to_ns(new_reading.utime_ticks, HZ)
    assert fields.cpu_system_nanos == ticks_to_ns(new_reading.stime_ticks, HZ)
    assert fields.on_cpu_nanos == sum(t.on_cpu_ns for t in new_reading.threads)
    assert fields.on_cpu_nanos < ticks_to_ns(old_reading.utime_ticks, HZ)
    start_ns = ticks_to_ns(new_reading.start_ticks, HZ)
    assert fields.observed_nanos == new_reading.at_ns - start_ns


def scrape(port: int) -> dict:
    """{(name, labels): value} of every sample of a procdelta page."""
    page = http_get(f"http://127.0.0.1:{port}/metrics").decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse_text(page)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def busy_group(request):
    """A busy process alone in a cgroup of its own; yields its cgroup label. With
    `capabilities=False` (indirect parameter) it holds no capabilities."""
    path = f"procdelta-test-{uuid.uuid4().hex[:8]}"
    capabilities = getattr(request, "param", True)
    with cgroup("v2", path) as cgroup_path:
        busy = spawn_busy(120, cgroup_path, capabilities)
        try:
            yield "/" + path
        finally:
            busy.kill()
            busy.wait()


def passes(port: int) -> float:
    return value(scrape(port), "procdelta_passes_total") or 0


def test_restart_starts_counters_from_zero_and_intervals_after_one_pass(busy_group):
    port = free_port()
    serve = start_serve(port)
    try:
        wait_until(lambda: passes(port) >= 4, 30, "four passes")
        before = scrape(port)
        total_before = value(before, "procdelta_on_cpu_nanos_total", cgroup=busy_group)
        assert total_before and total_before > 1e9
        serve.send_signal(signal.SIGKILL)
        serve.wait()
        # 3 s between passes: the page of the first pass is surely scraped before the next
        serve = start_serve(port, interval="3")
        wait_until(lambda: passes(port) >= 1, 30, "the first pass after the restart")
        first = scrape(port)
        assert value(first, "procdelta_passes_total") == 1
        # one pass: nothing to subtract from yet, so no interval and no counter series
        assert value(first, "procdelta_interval_processes", cgroup=busy_group) is None
        assert value(first, "procdelta_on_cpu_nanos_total", cgroup=busy_group) is None
        wait_until(lambda: passes(port) >= 2, 30, "the second pass after the restart")
        second = scrape(port)
        assert value(second, "procdelta_interval_processes", cgroup=busy_group) == 1
        # the counter started again from zero: it holds exactly the one interval since
        total_after = value(second, "procdelta_on_cpu_nanos_total", cgroup=busy_group)
        interval = value(second, "procdelta_interval_on_cpu_nanos", cgroup=busy_group)
        assert value(second, "procdelta_passes_total") == 2
        assert total_after == interval > 0
    finally:
        serve.kill()
        serve.wait()


def test_a_stalled_collector_reports_one_long_interval(busy_group):
    port = free_port()
    # 2 s between passes: the first pass after the stall is scraped before the next one
    serve = start_serve(port, interval="2")
    try:
        wait_until(lambda: passes(port) >= 3, 30, "three passes")
        stalled_at = passes(port)
        serve.send_signal(signal.SIGSTOP)
        time.sleep(6.5)  # more than three intervals
        serve.send_signal(signal.SIGCONT)
        wait_until(lambda: passes(port) >= stalled_at + 1, 30, "a pass after the stall")
        samples = scrape(port)
    finally:
        serve.kill()
        serve.wait()
    assert value(samples, "procdelta_passes_total") == stalled_at + 1
    interval = value(samples, "procdelta_interval_seconds")
    assert interval >= 6.4, "the first pass after the stall covers the whole stall"
    observed = value(samples, "procdelta_interval_observed_nanos", cgroup=busy_group)
    # one process observed for the whole interval, to within the gap between listing
    # and reading it
    assert observed is not None and abs(observed / 1e9 - interval) < 0.1
    negative = [k for k, v in samples.items() if k[0].startswith("procdelta_") and v < 0]
    assert negative == []


@pytest.mark.parametrize("busy_group", [False], indirect=True)
def test_without_privileges_it_says_so_once_and_exports_what_it_can(busy_group):
    port = free_port()
    serve = start_serve(port, prefix=tuple(DROP_CAPABILITIES))
    try:
        wait_until(lambda: passes(port) >= 3, 30, "three passes")
        samples = scrape(port)
    finally:
        serve.terminate()
        _, stderr = serve.communicate(timeout=10)
    unreadable = value(samples, "procdelta_dropped_deltas_total", reason="unreadable")
    assert unreadable and unreadable > 0
    # the busy process holds no capabilities either, so the kernel lets a reader with
    # none read its io: it still counts
    assert value(samples, "procdelta_interval_processes", cgroup=busy_group) == 1
    warnings = [line for line in stderr.splitlines() if "CAP_SYS_PTRACE" in line]
    assert len(warnings) == 1, stderr
    assert "level=warn" in warnings[0] and "SYS_PTRACE" in warnings[0]
    assert "Traceback" not in stderr

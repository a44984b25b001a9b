"""psutil as an independent oracle for what procdelta reads from live processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from collector.model import ProcessGone
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.readings import Unreadable
from tests.cgroups import WORKLOAD

HZ = os.sysconf("SC_CLK_TCK")


STORAGE_BYTES = 8 << 20


@pytest.fixture
def stopped_workload():
    """A multi-threaded process that has done some work, moved 8 MiB to storage and back
    in a thread of its own (fsync, then read with its pages dropped from the cache), then
    frozen by SIGSTOP. The file is on /var/tmp: a disk on CI, never tmpfs (where nothing
    reaches storage)."""
    directory = tempfile.mkdtemp(prefix="procdelta-oracle-", dir="/var/tmp")
    process = subprocess.Popen(
        [
            sys.executable,
            str(WORKLOAD),
            "--busy",
            "2",
            "--sleepers",
            "2",
            "--storage",
            f"{directory}/data:{STORAGE_BYTES}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().startswith("ready")
        time.sleep(0.5)
        os.kill(process.pid, signal.SIGSTOP)
        psutil.Process(process.pid)  # make sure it is there
        deadline = time.time() + 5
        while psutil.Process(process.pid).status() != psutil.STATUS_STOPPED:
            assert time.time() < deadline, "workload did not stop"
            time.sleep(0.01)
        yield process.pid
    finally:
        process.kill()
        process.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def test_stopped_process_matches_psutil_exactly(stopped_workload):
    pid = stopped_workload
    reading = Reader(ProcFS("/proc")).read_process(pid)
    oracle = psutil.Process(pid)
    with oracle.oneshot():
        times = oracle.cpu_times()
        created = oracle.create_time()
        rss = oracle.memory_info().rss
        tids = sorted(t.id for t in oracle.threads())
        switches = oracle.num_ctx_switches()
        io = oracle.io_counters()

    assert reading.pid == pid
    assert reading.comm == oracle.name()
    assert reading.start_ticks == round((created - psutil.boot_time()) * HZ)
    assert reading.utime_ticks == round(times.user * HZ)
    assert reading.stime_ticks == round(times.system * HZ)
    assert reading.utime_ticks > 0  # it did work: the comparison is not of zeros
    # `stat` reports the kernel's per-CPU-batched RSS counters without summing the CPUs'
    # pending parts (statm, which psutil reads, sums them on recent kernels): they may differ
    # by up to a batch (32 pages or 2 per CPU) per CPU for each of the three RSS counters.
    cpus = os.cpu_count() or 1
    slack = 3 * cpus * max(32, 2 * cpus) * os.sysconf("SC_PAGE_SIZE")
    assert abs(reading.rss_bytes - rss) <= slack
    assert sorted(t.tid for t in reading.threads) == tids
    assert len(tids) == 6  # the leader, 2 busy, 2 sleepers, the storage thread
    # psutil reads the leader's `status`; procdelta reads every thread's.
    leader = next(t for t in reading.threads if t.tid == pid)
    assert (leader.voluntary_switches, leader.nonvoluntary_switches) == (
        switches.voluntary,
        switches.involuntary,
    )
    assert sum(t.voluntary_switches for t in reading.threads) > switches.voluntary
    # No thread has exited and no child was reaped, so the per-thread sum is the process's
    # io, which psutil reads; the storage thread (not the leader) moved the bytes.
    assert sum(t.read_bytes for t in reading.threads) == io.read_bytes >= STORAGE_BYTES
    assert sum(t.write_bytes for t in reading.threads) == io.write_bytes >= STORAGE_BYTES
    mover = max(reading.threads, key=lambda t: t.write_bytes)
    assert mover.tid != pid and mover.read_bytes >= STORAGE_BYTES


def test_start_times_of_every_process_match_psutil():
    """Start time is the guard's identity: check it on the whole live process table."""
    reader = Reader(ProcFS("/proc"))
    boot = psutil.boot_time()
    compared = 0
    for pid, _ in ProcFS("/proc").processes():
        try:
            reading = reader.read_process(pid)
            oracle = psutil.Process(pid)
            created = oracle.create_time()
        except (ProcessGone, Unreadable, psutil.NoSuchProcess):
            continue  # gone since the listing, or never readable (e.g. /proc/1/io)
        assert reading.start_ticks == round((created - boot) * HZ), pid
        assert {t.tid for t in reading.threads} <= {t.id for t in oracle.threads()} | {pid}
        compared += 1
    assert compared >= 5

"""Both readers over live workloads and real pods of this host, round after round: the
incremental reading equals the plain one (tests/unit/test_incremental.py over fixtures)."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter

import pytest

from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS
from collector.engine import Engine
from collector.groups import Grouper
from collector.plainread import PlainReader
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker
from tests.cgroups import Workload, cgroup
from tests.fixturetree import every_process
from tests.unit.test_incremental import EVERY, CountingProcFS, both, comparable, write


@pytest.mark.kernel
def test_live_workload_frozen_between_reads(tmp_path):
    """Both readers over the same frozen process table, round after round."""
    path = f"procdelta-test-{uuid.uuid4().hex[:8]}"
    workload = ("--busy", "1", "--sleepers", "1", "--idle", "6", "--churn", str(tmp_path))
    no_io = ("--busy", "1", "--sleepers", "2")  # threads that run and never do storage I/O
    with (
        cgroup("v2", path) as sandbox,
        Workload(sandbox, *workload),
        Workload(sandbox, *no_io) as never_io,
        cgroup("v2", path + "-asleep") as bed,
        Workload(bed, "--idle", "3") as asleep,  # never runs once started (nor frozen:
    ):  # freezing and thawing wakes every task)
        full, fast, fast_fs = both("/proc")
        skipped_rounds = io_skipped_rounds = stat_skipped_rounds = 0
        io_whole_rounds = status_whole_rounds = 0
        for round_ in range(12):
            freeze(sandbox, True)
            try:
                with open(f"{sandbox}/cgroup.procs") as procs:
                    pids = {int(p) for p in procs.read().split()} | {asleep.pid}
                fast_fs.by_pid.clear()
                fast_fs.stat_read.clear()
                a, b = full.read_pass(), fast.read_pass()
            finally:
                freeze(sandbox, False)
            ours_full = {p: r for p, r in comparable(a.processes).items() if p in pids}
            ours_fast = {p: r for p, r in comparable(b.processes).items() if p in pids}
            for ours in (ours_full, ours_fast):  # not frozen: reclaim may shrink its RSS,
                if asleep.pid in ours:  # which a quiet process's reading keeps K passes
                    ours[asleep.pid] = ours[asleep.pid]._replace(rss_bytes=0)
            assert ours_full == ours_fast, f"round {round_}"
            assert ours_full, "the workload is in the sandbox"
            # counted over the workload's own processes only, not the host's
            read_now = Counter()
            for (pid, name), n in fast_fs.by_pid.items():
                if pid in pids:
                    read_now[name] += n
            if read_now["task/status"] < read_now["task/schedstat"]:
                skipped_rounds += 1
            status_whole_rounds += not (asleep.pid + round_ + 1) % EVERY
            pid = never_io.pid
            if fast_fs.by_pid[pid, "task/io"] < fast_fs.by_pid[pid, "task/status"]:
                io_skipped_rounds += 1
            # read whole this round, or the round after one: its own `io` total was not
            # read, so its threads' `io` is (collector/reading.py `io_unmoved`)
            io_whole_rounds += any(not (pid + round_ + k) % EVERY for k in (0, 1))
            if asleep.pid in ours_fast and asleep.pid not in fast_fs.stat_read:
                stat_skipped_rounds += 1
            time.sleep(0.15)
    # (thawing wakes every task of the sandbox: the threads that do not run are the
    # sleeping process's) every round but the first, and those that read it whole
    assert skipped_rounds >= 12 - 1 - status_whole_rounds, "idle threads' status not skipped"
    # (its first two rounds read its `io` too: first sighting, then no total yet)
    assert io_skipped_rounds >= 12 - 2 - io_whole_rounds - 1, (
        "the no-I/O process's threads ran and kept their bytes"
    )
    assert stat_skipped_rounds >= 6, "the sleeping process was read from its schedstat alone"


def freeze(path: str, frozen: bool) -> None:
    write(os.path.join(path, "cgroup.freeze"), "1" if frozen else "0")
    deadline = time.time() + 5
    while time.time() < deadline:
        with open(os.path.join(path, "cgroup.events")) as events:
            if f"frozen {int(frozen)}" in events.read():
                return
        time.sleep(0.005)
    raise AssertionError(f"cgroup {path} did not {'freeze' if frozen else 'thaw'}")


@pytest.mark.kernel
def test_live_pods_an_idle_one_is_not_read_and_all_are_identical_to_a_full_read(tmp_path):
    """Real pods on this host's v2 tree: one idle, one busy (frozen while both engines
    read it), one where one thread of one process runs once. The engine that carries
    the processes of a quiet cgroup reads none of the idle pod's files, and its readings
    are those of a reader that reads every file."""
    pods = {name: (str(uuid.uuid4()), uuid.uuid4().hex * 2) for name in ("idle", "busy", "once")}
    paths = {name: f"kubepods/burstable/pod{uid}/{cid}" for name, (uid, cid) in pods.items()}
    with (
        cgroup("v2", paths["idle"]) as idle,
        cgroup("v2", paths["busy"]) as busy,
        cgroup("v2", paths["once"]) as once,
        Workload(idle, "--idle", "3"),
        Workload(idle, "--idle", "1"),
        Workload(busy, "--busy", "1", "--sleepers", "1"),
        Workload(once, "--idle", "2") as once_work,
    ):
        pids = {}
        for name, directory in (("idle", idle), ("busy", busy), ("once", once)):
            with open(f"{directory}/cgroup.procs") as procs:
                pids[name] = {int(p) for p in procs.read().split()}
        fast_fs = CountingProcFS("/proc")

        def engine(procfs, fast: bool) -> Engine:
            return Engine(
                Reader(procfs, page_size=4096) if fast else PlainReader(procfs, page_size=4096),
                Tracker(100),
                Grouper(PodNames(str(tmp_path), str(tmp_path))),
                Totals(),
                cgroupfs=CgroupFS("/sys/fs/cgroup"),
                carry_quiet=fast,
            )

        fast, full = engine(fast_fs, True), engine(ProcFS("/proc"), False)
        captured = {}
        for which, reader in (("fast", fast.reader), ("full", full.reader)):
            read = reader.read_pass
            reader.read_pass = lambda quiet=None, read=read, which=which: (
                captured.setdefault(which, []).append(read(quiet)) or captured[which][-1]
            )
        idle_unread = once_unread = 0
        for round_ in range(12):
            if round_ == 6:
                assert once_work.ask("count") == "0"  # its main thread runs, once
            freeze(busy, True)
            try:
                fast_fs.by_pid.clear()
                fast.run_pass()
                full.run_pass()
            finally:
                freeze(busy, False)
            everyone = pids["idle"] | pids["busy"] | pids["once"]
            ours_fast = {
                p: r
                for p, r in comparable(every_process(captured["fast"][-1])).items()
                if p in everyone
            }
            ours_full = {
                p: r
                for p, r in comparable(every_process(captured["full"][-1])).items()
                if p in everyone
            }
            for ours in (ours_fast, ours_full):  # unfrozen and asleep: reclaim may shrink their
                for pid in pids["idle"] | pids["once"]:  # RSS, kept up to K passes when carried
                    if pid in ours:
                        ours[pid] = ours[pid]._replace(rss_bytes=0)
            assert ours_fast == ours_full, f"round {round_}"
            assert set(ours_fast) == everyone
            read_of = {pid for (pid, _), count in fast_fs.by_pid.items() if count}
            if not read_of & pids["idle"]:
                idle_unread += 1
            if not read_of & pids["once"]:
                once_unread += 1
            if round_ == 6:
                assert read_of & pids["once"], "the pod that ran is read"
            assert read_of & pids["busy"], f"round {round_}: the busy pod is read every pass"
            time.sleep(0.1)
    # From the third pass (the cgroup files confirmed), but for each process's periodic
    # refresh: the idle pod is not read at all
    assert idle_unread >= 6, idle_unread
    assert once_unread >= 5, once_unread

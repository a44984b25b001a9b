"""The bound on real pods of this host: a process moved to a busy pod is counted within K
passes (tests/unit/test_bound.py holds the same over proc trees of plain files)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from collector.wiring import Options, build_engine
from tests.cgroups import Workload, cgroups
from tests.unit.test_bound import K


def _on_cpu_ns(pid: int) -> int:
    """The kernel's on-CPU time of a process: the sum over its threads' `schedstat`."""
    task = f"/proc/{pid}/task"
    total = 0
    for tid in os.listdir(task):
        with open(f"{task}/{tid}/schedstat") as schedstat:
            total += int(schedstat.read().split()[0])
    return total


@pytest.mark.kernel
def test_a_process_moved_to_a_busy_pod_on_the_kernel_is_counted_within_k_passes(tmp_path):
    """Real pods on this host, both hierarchies: a process idles in pod A, then the test
    moves it into pod B (as a runtime or an operator can) and makes it run there. Pod A's
    usage stands still, so the collector carries it unread as A's until it reads it whole;
    within K passes every ns it ran is in the totals, and over the whole run the totals of
    the two pods equal the kernel's on-CPU time of the process."""
    kinds = ("v2", "cpu", "cpuacct")
    uids = {name: str(uuid.uuid4()) for name in "ab"}
    pods = {name: f"kubepods/besteffort/pod{uid}/{'c' * 64}" for name, uid in uids.items()}

    def counted() -> int:
        """On-CPU time in the totals of pods A and B (the host may have other pods)."""
        totals = engine.totals.snapshot().items()
        return sum(t.get("on_cpu_nanos", 0) for g, t in totals if g.labels[2][1] in uids.values())

    with (
        cgroups(kinds, pods["a"]) as a,
        cgroups(kinds, pods["b"]) as b,
        Workload(list(a.values()), "--idle", "1") as work,
    ):
        options = Options(pod_logs=str(tmp_path), container_logs=str(tmp_path), pods_only=True)
        engine = build_engine(options)
        time.sleep(0.3)  # its threads started and blocked: nothing of it moves until asked
        before = _on_cpu_ns(work.pid)
        passes = 0
        # idle passes, until the move falls two passes or more before its whole read
        while passes < 3 or any(not (work.pid + passes + k) % K for k in (1, 2)):
            engine.run_pass()
            passes += 1
        for path in dict.fromkeys(b.values()):
            with open(os.path.join(path, "cgroup.procs"), "w") as procs:
                procs.write(str(work.pid))
        late = []
        for _ in range(K + 1):
            for _ in range(20):
                work.ask("count")  # it runs, in pod B
            engine.run_pass()
            late.append(counted() < _on_cpu_ns(work.pid) - before)
        time.sleep(0.3)  # its last answer written: nothing of it moves any more
        engine.run_pass()
        after = _on_cpu_ns(work.pid)
        in_b = {g.labels[2][1]: t for g, t in engine.totals.snapshot().items()}[uids["b"]]
    assert late[0], "carried at first: pod A's usage stood still"
    assert counted() == after - before  # every ns, none lost, within K passes
    assert in_b["on_cpu_nanos"] > 0  # counted where it ran

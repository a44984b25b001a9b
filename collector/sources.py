"""What the node provides, found once at start-up and said once per missing source.

Without these the collector still runs, but some fields have no data, and a user sees
"the metric exists but stays at 0" with no reason. `procdelta_source_available{source}`
exports the same findings.
"""

from __future__ import annotations

import logging
import os

from collector.cgroupfs import Hierarchies
from collector.model import Malformed
from collector.procfs import read_or_none
from collector.waits import NodeCPU, parse_node_cpu

log = logging.getLogger("procdelta")

_THROTTLING = "cpu_periods, cpu_throttled_periods, cpu_throttled_nanos"
_PRESSURE = "the six *_pressure_* fields"


def probe_procfs(procfs: str) -> dict[str, bool]:
    """schedstat and per-thread io, as the reader's own thread sees them through `procfs`.

    `schedstat` reads `0 0 0` for every task when the kernel keeps no sched_info (no
    CONFIG_SCHEDSTATS and delay accounting off); this thread has run, so its on-CPU time
    is not 0 where the kernel counts it.
    """
    schedstat = read_or_none(os.path.join(procfs, "thread-self", "schedstat"))
    io = read_or_none(os.path.join(procfs, "thread-self", "io"))
    return {
        "schedstat": bool(schedstat and schedstat.split()[:1] != [b"0"]),
        "thread_io": bool(io and b"read_bytes" in io),
    }


def node_cpu(procfs: str, hz: int) -> NodeCPU | None:
    """The node's online CPUs and their busy time, from `<procfs>/stat` (collector/waits.py).
    None where the file cannot be read or parsed."""
    data = read_or_none(os.path.join(procfs, "stat"))
    if data is None:
        return None
    try:
        return parse_node_cpu(data, hz)
    except Malformed:
        return None


def online_cpus(procfs: str) -> int | None:
    """The node's online CPUs: the `cpu<N>` lines of `<procfs>/stat` (the kernel prints one
    per online CPU). None where the file cannot be read."""
    data = read_or_none(os.path.join(procfs, "stat"))
    if data is None:
        return None
    count = sum(1 for line in data.splitlines() if line[:3] == b"cpu" and line[3:4].isdigit())
    return count or None


def probe_cgroups(hierarchies: Hierarchies) -> dict[str, bool]:
    return {
        "cgroup_v2": hierarchies.v2 is not None,
        "cgroup_v1_cpu": hierarchies.cpu is not None,
        "cgroup_v1_cpuacct": hierarchies.cpuacct is not None,
        "psi": hierarchies.psi,
    }


def log_missing(sources: dict[str, bool], procfs: str, cgroupfs: str | None) -> None:
    """One line per missing source: which fields will be absent (or 0), and why."""
    if not sources.get("schedstat", True):
        log.warning(
            "%s/thread-self/schedstat reads 0 0 0: the kernel keeps no sched_info "
            "(CONFIG_SCHEDSTATS off and delay accounting off; boot with `delayacct` or "
            "set kernel.sched_schedstats=1), so on_cpu_nanos and run_delay_nanos will be 0",
            procfs,
        )
    if not sources.get("thread_io", True):
        log.warning(
            "%s/thread-self/io is missing (a kernel without CONFIG_TASK_IO_ACCOUNTING): "
            "processes cannot be read whole and contribute no delta",
            procfs,
        )
    if cgroupfs is None:
        return
    v2, cpu, cpuacct = sources["cgroup_v2"], sources["cgroup_v1_cpu"], sources["cgroup_v1_cpuacct"]
    if not (v2 or cpu or cpuacct):
        log.warning(
            "no cgroup hierarchy found under %s (mount the host's /sys/fs/cgroup there): "
            "every cgroup field (docs/reference.md §7) will be absent",
            cgroupfs,
        )
        return
    if not v2:
        log.info(
            "no cgroup v2 tree under %s (a cgroup v1 host): %s will be absent (PSI is v2 "
            "only); usage and throttling come from v1",
            cgroupfs,
            _PRESSURE,
        )
    elif not sources.get("psi", True):  # absent: not read (--no-collector.cgroup.pressure)
        log.warning(
            "the cgroup v2 tree under %s has no readable cpu.pressure (a kernel without "
            "CONFIG_PSI, or booted with psi=0; psi=1 turns it on): %s will be absent",
            cgroupfs,
            _PRESSURE,
        )
    if not cpu:
        if v2:
            log.info(
                "no cgroup v1 cpu controller under %s: %s come from the v2 cpu.stat where "
                "the v2 cpu controller is on (everywhere kubelet sets a quota on a pure v2 "
                "host), and are absent elsewhere",
                cgroupfs,
                _THROTTLING,
            )
        else:
            log.warning(
                "no cgroup v1 cpu controller under %s: %s will be absent", cgroupfs, _THROTTLING
            )
    if not cpuacct:
        if v2:
            log.info(
                "no cgroup v1 cpuacct controller under %s: cgroup_cpu_nanos comes from the "
                "v2 cpu.stat",
                cgroupfs,
            )
        else:
            log.warning(
                "no cgroup v1 cpuacct controller under %s: cgroup_cpu_nanos will be absent",
                cgroupfs,
            )

"""Why a group waited: on the node, each pass, by cause (docs/findings.md, "Why a pod
waits", says what each part's error is).

Three causes leave the same trace, a runnable task that does not run, and each asks for
a different action: the group's own CPU quota throttled it; its own tasks outnumbered
the CPUs it may use; other groups held those CPUs. Two bases tell them apart.

**The kernel's moment-by-moment account** (`split_cpu_stall`), where the group's cgroup
has CPU pressure with a `full` line (cgroup v2, and the v2 tree of a hybrid host; Linux
5.13+). The kernel keeps it per CPU (kernel/sched/psi.c): a CPU is in the group's
`some` state while a task of the group waits there, and in its `full` state while a task
of the group waits there and none of the group's runs there; each CPU's time in a state is
weighted by the time the group had work on it, and the totals are that average, in wall
time. Both count every task that ran in the cgroup, exited ones included. So `full` is
time its tasks waited behind others' (or throttled: a throttled group runs nowhere): its
quota's part is the wall time its quotas throttled it (`throttled_wall_ns`, at most
`full`), the rest its neighbours'. `some` beyond `full` is time its tasks waited on a CPU
where another of its own ran: its own threads'.

**The interval's averages** (`split_run_delay`), where the cgroup has no such line: its
run delay (schedstat, thread-time, over the processes that lived through the interval)
is taken in order by its quota (the throttled time, capped at the run delay), by its own
threads (runnable thread-time beyond the CPUs it may use x the interval: its cpuset's,
where known, else the node's) and by its neighbours (what is left, at most the CPU time the
rest of the node used). A group busy in bursts shows part of its own threads' wait as its
neighbours' here: the kernel's account has no such error.

A group's causes are on one basis or the other in a pass, never both: the exported fields say
which (`cpu_stalled_*`, `cpu_waiting_own_threads_nanos`: wall time;
`run_delay_*`: thread-time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from collector.groups import Group
from collector.model import CgroupFields, CpuSet, Fields, Malformed, ticks_to_ns

_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
"""Of `/proc/stat`'s `cpu` line (user nice system idle iowait irq softirq steal guest
guest_nice): the columns a CPU spends running something — user, nice, system, irq,
softirq, steal. Guest time is already inside user and nice (Documentation/filesystems/proc.rst)."""


class NodeCPU(NamedTuple):
    """The node's CPUs as `/proc/stat` gives them at one instant."""

    cpus: int  # online CPUs: one `cpu<N>` line each
    busy_ns: int  # time all of them spent running something since boot


def parse_node_cpu(data: bytes, hz: int) -> NodeCPU:
    """`/proc/stat`: the online CPUs and the busy time of the aggregate `cpu` line."""
    cpus = 0
    busy_ns = None
    for line in data.splitlines():
        if line[:3] != b"cpu":
            break  # the cpu lines come first
        if line[3:4].isdigit():
            cpus += 1
        elif line[3:4] == b" ":
            columns = line.split()[1:]
            try:
                busy_ns = ticks_to_ns(sum(int(columns[i]) for i in _BUSY_COLUMNS), hz)
            except (IndexError, ValueError):
                raise Malformed("stat", line) from None
    if busy_ns is None or not cpus:
        raise Malformed("stat", data[:80])
    return NodeCPU(cpus, busy_ns)


class NodeInterval(NamedTuple):
    """What the node's CPUs did between two passes."""

    cpus: int
    interval_ns: int  # wall time between the two passes' listings
    busy_ns: int  # CPU time spent running something, summed over CPUs


def node_interval(
    before: NodeCPU | None, now: NodeCPU | None, interval_ns: int | None
) -> NodeInterval | None:
    """None where either reading is missing or the busy time fell (no wrong interval)."""
    if before is None or now is None or interval_ns is None or interval_ns <= 0:
        return None
    busy = now.busy_ns - before.busy_ns
    if busy < 0:
        return None
    return NodeInterval(now.cpus, interval_ns, busy)


def split_run_delay(
    fields: Fields, cgroup: CgroupFields, node: NodeInterval, cpus: int | None = None
) -> tuple[int, int, int]:
    """(throttled, own threads, neighbours): the parts of a group's run delay in one
    interval that each cause explains on the interval's averages (the module's
    docstring), in nanoseconds of thread-time. `cpus`: how many CPUs the group may use
    (`collector.cpusets`), where known; else the node's."""
    delay = fields.run_delay_nanos
    throttled = min(delay, cgroup.cpu_throttled_nanos or 0)
    left = delay - throttled
    runnable = fields.on_cpu_nanos + delay
    own = min(left, max(0, runnable - (cpus or node.cpus) * node.interval_ns))
    left -= own
    used = max(fields.on_cpu_nanos, cgroup.cgroup_cpu_nanos or 0)
    others = max(0, node.busy_ns - used)
    return throttled, own, min(left, others)


def throttled_wall_ns(
    throttled_periods: int, throttled_ns: int, quota_ns: int | None, period_ns: int | None
) -> int:
    """The wall time in which one cgroup's quota throttled it over an interval, from its
    throttled time, which the kernel sums over the CPUs whose run queues it throttled.

    In a throttled period of length P the cgroup used its quota Q in the part U of the
    period it ran, on c CPUs at once (Q = c·U); each of those c run queues was throttled
    for the rest of the period: throttled time T = c·(P - U) a period. So c = (T + Q)/P,
    and the wall time throttled, T/c = P·T/(T + Q) a period; over n such periods,
    n·P·T/(T + n·Q). Never more than T (a throttled moment has a run queue throttled) nor
    n·P. Without the quota (not read, or removed since), T itself: one run queue at a
    time, never less than the truth."""
    if throttled_ns <= 0:
        return 0
    if not throttled_periods or quota_ns is None or not period_ns:
        return throttled_ns
    span = throttled_periods * period_ns
    return min(
        throttled_ns, span, span * throttled_ns // (throttled_ns + throttled_periods * quota_ns)
    )


def split_cpu_stall(
    waiting_ns: int | None, stalled_ns: int, throttled_ns: int
) -> tuple[int, int, int]:
    """(throttled, neighbours, own threads): why a group waited over an interval, in wall
    time, from its CPU pressure's `some` (`waiting_ns`) and `full` (`stalled_ns`) and the
    wall time its quotas throttled it (the module's docstring)."""
    throttled = min(stalled_ns, throttled_ns)
    own = 0 if waiting_ns is None else max(0, waiting_ns - stalled_ns)
    return throttled, stalled_ns - throttled, own


def with_waits(
    intervals: Mapping[Group, Fields],
    cgroup_intervals: Mapping[Group, CgroupFields],
    throttled_wall: Mapping[Group, int],
    node: NodeInterval | None,
    cpusets: Mapping[Group, CpuSet] | None = None,
) -> dict[Group, CgroupFields]:
    """The cgroup intervals (the guard's deltas) with why each group waited: the one place
    the causes are formed. On the kernel's account (`split_cpu_stall`) for the groups in
    `throttled_wall` (whose causes the guard found can be the kernel's: the wall time
    their quotas throttled them); elsewhere on the interval's averages
    (`split_run_delay`), where the group has a process interval this pass and the node's
    interval is known; the other groups as they were. `cpusets`: each group's CPUs, where
    known (its own threads are measured against them)."""
    cpusets = cpusets or {}
    split = dict(cgroup_intervals)
    for group, wall in throttled_wall.items():
        split[group] = _with_stall_causes(cgroup_intervals[group], wall)
    if node is None:
        return split
    for group, cgroup in cgroup_intervals.items():
        fields = intervals.get(group)
        if fields is not None and group not in throttled_wall:
            cpuset = cpusets.get(group)
            cpus = cpuset.count if cpuset is not None else None
            throttled, own, neighbours = split_run_delay(fields, cgroup, node, cpus)
            split[group] = replace(
                cgroup,
                run_delay_throttled_nanos=throttled,
                run_delay_own_threads_nanos=own,
                run_delay_neighbours_nanos=neighbours,
                run_delay_runnable_nanos=fields.on_cpu_nanos + fields.run_delay_nanos,
            )
    return split


def _with_stall_causes(cgroup: CgroupFields, throttled_wall_ns: int) -> CgroupFields:
    """`cgroup` with its causes on the kernel's account (it has a CPU `full` line)."""
    waiting, stalled = cgroup.cpu_pressure_waiting_nanos, cgroup.cpu_pressure_stalled_nanos
    assert stalled is not None
    if not (stalled or waiting or throttled_wall_ns):
        return _still(cgroup)  # most groups, most passes: nothing waited
    throttled, neighbours, own = split_cpu_stall(waiting, stalled, throttled_wall_ns)
    return replace(
        cgroup,
        cpu_stalled_throttled_nanos=throttled,
        cpu_stalled_neighbours_nanos=neighbours,
        cpu_waiting_own_threads_nanos=own,
    )


@lru_cache(maxsize=64)
def _still(cgroup: CgroupFields) -> CgroupFields:
    """A group that did not wait, with its causes at 0: made once for each of the guard's
    shared deltas of readings that did not move (`cgroupguard._nothing_moved`)."""
    return replace(
        cgroup,
        cpu_stalled_throttled_nanos=0,
        cpu_stalled_neighbours_nanos=0,
        cpu_waiting_own_threads_nanos=0,
    )

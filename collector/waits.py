"""Why a group waited: its run delay split by cause, on the node, each pass.

A thread's run delay (schedstat field 2) is time runnable but not running. Three causes
leave the same trace there, and only the node has what tells them apart in the same
interval (docs/findings.md, "Why a pod waits"):

* its own CPU quota: a throttled group's runnable threads stay queued until the next
  period (docs/reference.md §7). The kernel counts the time each of its cgroups' run
  queues was throttled, summed over CPUs (`throttled_usec`, `throttled_time`): the part of
  the run delay its own limits explain is at least that, and exactly that for one runnable
  thread per throttled queue;
* its own threads: a group with more runnable threads than the node has CPUs waits even
  alone. Over an interval of length Δ its threads were runnable `on_cpu + run_delay`
  thread-time; beyond `cpus * Δ` of it no scheduler could have run them;
* its neighbours: the rest of its wait, where other groups held the CPUs it could have
  used; never more than the CPU time the rest of the node used meanwhile (a CPU-second
  that another group did not use was one this group could have had).

Each part is taken in that order from what the earlier ones left, so the three never sum
past the run delay; what remains (wake-up latency, migrations) is unattributed. The
arithmetic assumes a fair, work-conserving scheduler over the interval: a group busier in
bursts than its interval's average shows more of its own-threads wait as its neighbours'
where the node was busy meanwhile, and a group pinned to fewer CPUs than the node's
(cpusets) likewise (docs/findings.md says how large each error is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from collector.groups import Group
from collector.model import CgroupFields, Fields, Malformed, ticks_to_ns

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
    fields: Fields, cgroup: CgroupFields, node: NodeInterval
) -> tuple[int, int, int]:
    """(throttled, own threads, neighbours): the parts of a group's run delay in one
    interval that each cause explains (the module's docstring), in nanoseconds."""
    delay = fields.run_delay_nanos
    throttled = min(delay, cgroup.cpu_throttled_nanos or 0)
    left = delay - throttled
    runnable = fields.on_cpu_nanos + delay
    own = min(left, max(0, runnable - node.cpus * node.interval_ns))
    left -= own
    used = max(fields.on_cpu_nanos, cgroup.cgroup_cpu_nanos or 0)
    others = max(0, node.busy_ns - used)
    return throttled, own, min(left, others)


def with_waits(
    intervals: Mapping[Group, Fields],
    cgroup_intervals: Mapping[Group, CgroupFields],
    node: NodeInterval | None,
) -> dict[Group, CgroupFields]:
    """The cgroup intervals with each group's run delay split by cause, where the group
    has both a process interval and a cgroup delta this pass, and the node's interval is
    known; the other groups as they were (their three fields None)."""
    if node is None:
        return dict(cgroup_intervals)
    split = {}
    for group, cgroup in cgroup_intervals.items():
        fields = intervals.get(group)
        if fields is not None:
            throttled, own, neighbours = split_run_delay(fields, cgroup, node)
            cgroup = replace(
                cgroup,
                run_delay_throttled_nanos=throttled,
                run_delay_own_threads_nanos=own,
                run_delay_neighbours_nanos=neighbours,
            )
        split[group] = cgroup
    return split

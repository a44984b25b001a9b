"""Shapes of waiting, measured on this machine's kernel: `python -m tests.tools.waitshapes`.

Each shape runs tests/workload.py in real cgroups (the v1 `cpu` and `cpuacct` controllers
beside the v2 tree, as on this project's hosts; as root) for a few seconds, and prints per
second of wall time what the kernel counted (the cgroup's CPU, its CPU pressure's `some`
and `full`, its throttled time) and what procdelta makes of it (collector/waits.py): the
parts of its wait its quota, its neighbours and its own threads explain. docs/findings.md,
"Why a pod waits", quotes a run. Laid out for two CPUs (CPU 0 and 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass

from collector.cgroupfs import CgroupFS, Location
from collector.cgroupguard import cgroup_delta
from tests.cgroupfixture import read_group
from tests.cgroups import Workload, cgroups

KINDS = ("cpu", "cpuacct", "v2")
PERIOD_US = 100_000


@dataclass(frozen=True)
class Group:
    name: str
    args: tuple[str, ...]
    quota_cpus: float | None = None


SHAPES: dict[str, list[Group]] = {
    "3 busy threads pinned to CPU 0, a neighbour busy on CPU 1": [
        Group("pinned", ("--busy", "3", "--busy-cpus", "0,0,0")),
        Group("beside", ("--busy", "1", "--busy-cpus", "1")),
    ],
    "1 thread sharing CPU 0 with a 2-thread group": [
        Group("victim", ("--busy", "1", "--busy-cpus", "0")),
        Group("pair", ("--busy", "2", "--busy-cpus", "0,0")),
    ],
    "3 and 2 threads in opposite halves of each second": [
        Group("first-half", ("--busy", "3", "--burst", "0:500")),
        Group("second-half", ("--busy", "2", "--burst", "500:500")),
    ],
    "two 2-thread groups sharing both CPUs": [
        Group("left", ("--busy", "2")),
        Group("right", ("--busy", "2")),
    ],
    "1 thread at a 20% quota": [Group("quota", ("--busy", "1"), 0.2)],
    "2 threads under a 1.5-CPU quota": [Group("quota", ("--busy", "2"), 1.5)],
    "4 threads under a 1-CPU quota": [Group("quota", ("--busy", "4"), 1.0)],
}


def measure(groups: list[Group], seconds: float, prefix: str) -> list[str]:
    """The shape's lines: one per group, per second of wall time."""
    fs = CgroupFS("/sys/fs/cgroup")
    with contextlib.ExitStack() as stack:
        where = {}
        for group in groups:
            dirs = stack.enter_context(cgroups(KINDS, f"{prefix}/{group.name}"))
            if group.quota_cpus is not None:
                with open(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), "w") as quota:
                    quota.write(str(int(group.quota_cpus * PERIOD_US)))
            stack.enter_context(Workload(list(dirs.values()), *group.args))
            path = f"/{prefix}/{group.name}".encode()
            where[group.name] = [Location(h, path, None, True) for h in KINDS]
        time.sleep(1)  # past the workloads' start
        before = {name: read_group(fs, locations) for name, locations in where.items()}
        began = time.monotonic()
        time.sleep(seconds)
        after = {name: read_group(fs, locations) for name, locations in where.items()}
        wall_ns = (time.monotonic() - began) * 1e9
    lines = []
    for name in where:
        delta = cgroup_delta(after[name], before[name])
        per = {field: (value or 0) / wall_ns for field, value in delta.as_dict().items()}
        lines.append(
            f"  {name:12} cpu {per['cgroup_cpu_nanos']:.3f}"
            f"  some {per['cpu_pressure_waiting_nanos']:.3f}"
            f"  full {per['cpu_pressure_stalled_nanos']:.3f}"
            f"  throttled {per['cpu_throttled_nanos']:.3f}"
            f" | quota's {per['cpu_stalled_throttled_nanos']:.3f}"
            f"  neighbours' {per['cpu_stalled_neighbours_nanos']:.3f}"
            f"  own threads' {per['cpu_waiting_own_threads_nanos']:.3f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each shape's span")
    args = parser.parse_args()
    if os.cpu_count() != 2:
        print(f"laid out for 2 CPUs; this machine has {os.cpu_count()}", file=sys.stderr)
    prefix = f"kubepods/procdelta-shapes-{os.getpid()}"
    print(f"per second of wall time, over {args.seconds:g} s (kernel {os.uname().release})")
    for title, groups in SHAPES.items():
        print(title)
        for line in measure(groups, args.seconds, prefix):
            print(line, flush=True)


if __name__ == "__main__":
    main()

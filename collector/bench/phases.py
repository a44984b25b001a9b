"""Where a served pass spends its time: `python -m collector.bench.phases` (needs root).

The bench's pods10 table (collector/bench/tables.py: 110 pod cgroups laid out as kubelet does, the
processes of 10 of them running); an `Engine` and a `PassLoop` built as `serve` builds them run here
a pass every `--interval`. Each phase is timed on this thread's CPU clock by wrapping what the pass
calls (collector/ as it is): a phase's own time, less the phases inside it; a garbage collection is
a row of its own. The scrape is what `MetricsServer._metrics` makes for Prometheus (OpenMetrics,
gzipped; not the listener's HTTP). `kernel-ms`: the directories and files one pass lists and reads,
again as bare system calls. The naive floor (floor.py) runs beside, split likewise."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from unittest.mock import patch

import collector.cgroupfs
import collector.cgrouppass
import collector.engine
from collector.bench.floor import naive_pass, read_file
from collector.bench.serve import SERVED_INTERVAL
from collector.bench.tables import pid_room, pod_cgroups, pod_names, synthetic_table
from collector.engine import GC_SWEEP_PASSES
from collector.exporter import LiveMetrics
from collector.passloop import PassLoop
from collector.wiring import Options, build_engine, node_cpus

SERVED_ROWS = (
    ("list", "listing /proc"),
    ("cg-list", "listing cgroups"),
    ("cg-read", "reading cgroups"),
    ("read", "reading the running pods' processes"),
    ("carry", "proving cgroups quiet, carrying blocks"),
    ("guard", "the guard (processes, cgroups)"),
    ("sums", "the sums"),
    ("node", "pod names, node CPU"),
    ("result", "the pass's result, published, its view"),
    ("render", "building and rendering the page"),
    ("scrape", "the scrape: page joined, gzipped"),
    ("live", "the scrape: process_/python_ metrics"),
    ("gc", "GC (young collections)"),
    ("sweep", f"GC sweep (every {GC_SWEEP_PASSES} passes, amortised)"),
)
FLOOR_ROWS = (
    ("list", "listing /proc"),
    ("tasks", "listing each process's task/"),
    ("read", "reading and splitting the files"),
)


class PhaseClock:
    """Each phase's own CPU time (this thread's), less the phases timed inside it."""

    def __init__(self) -> None:
        self.spent: Counter[str] = Counter()
        self._stack: list[list] = []  # [phase, started, spent by phases inside it]

    def enter(self, phase: str) -> None:
        self._stack.append([phase, time.thread_time_ns(), 0])

    def leave(self) -> None:
        phase, started, inside = self._stack.pop()
        took = time.thread_time_ns() - started
        self.spent[phase] += took - inside
        if self._stack:
            self._stack[-1][2] += took

    def timed(self, phase: str, call: Callable, *args, **kwargs):
        self.enter(phase)
        try:
            return call(*args, **kwargs)
        finally:
            self.leave()

    def wrapped(self, owner: object, name: str, phase: str) -> contextlib.AbstractContextManager:
        """`owner.name` (an instance's, a module's or a class's) timed as `phase`, put back."""
        call = getattr(owner, name)  # a function: on a class, it binds as the method did
        return patch.object(owner, name, lambda *a, **k: self.timed(phase, call, *a, **k))

    @property
    def phase(self) -> str:
        return self._stack[-1][0] if self._stack else ""

    def on_gc(self, stage: str, _info: dict) -> None:
        if stage == "start":
            self.enter("gc")
        elif self._stack and self._stack[-1][0] == "gc":
            self.leave()


def served_phases(
    options: Options, passes: int, warmup: int, interval: float, beside: Callable[[], None]
) -> dict:
    """Each phase's CPU per pass (ms, each measured pass's), the sweep's share, `kernel_floor`;
    `beside` runs halfway between two measured passes (the floor's pass)."""
    engine = build_engine(options, freeze_gc=True)
    loop = PassLoop(engine, interval, shapes=options.shapes, cpus=node_cpus(options))
    live = LiveMetrics(ttl=0)  # a scrape every interval or more: read anew at each
    clock = PhaseClock()
    reader, cgroupfs, grouper = engine.reader, engine.cgroupfs, engine.grouper
    wrapped = (
        (reader.procfs, "processes", "list"),
        (reader, "read_pass", "read"),
        (reader, "_carry_blocks", "carry"),
        (collector.cgrouppass.CgroupPass, "quiet", "carry"),
        (engine.cgroups.pods, "pods", "cg-list"),
        (grouper, "learn_qos", "cg-list"),
        (cgroupfs, "read_groups", "cg-read"),
        (engine.tracker, "advance", "guard"),
        (engine.cgroups.tracker, "advance", "guard"),
        (cgroupfs, "release_unused", "guard"),
        (collector.engine, "group_pass", "sums"),
        (collector.engine, "with_waits", "sums"),
        (engine.totals, "add_pass", "sums"),
        (grouper, "refresh", "node"),
        (engine, "node_cpu", "node"),
        (loop, "cpus", "node"),
        (engine, "run_pass", "result"),
        (loop._renderer, "render", "render"),
    )

    def scrape() -> None:  # what MetricsServer._metrics makes for Prometheus
        page = loop.snapshot().page
        clock.timed("scrape", page.body, True, True)
        clock.timed("live", live.page, True, True)

    per_pass: dict[str, list[float]] = defaultdict(list)
    with contextlib.ExitStack() as stack:
        for owner, name, phase in wrapped:
            stack.enter_context(clock.wrapped(owner, name, phase))
        gc.callbacks.append(clock.on_gc)
        stack.callback(gc.callbacks.remove, clock.on_gc)
        for number in range(warmup + passes):
            time.sleep(interval / 2 if number > warmup else interval)
            clock.spent.clear()
            clock.timed("result", loop.run_pass)
            scrape()
            if number >= warmup:
                for phase, _ in SERVED_ROWS:
                    per_pass[phase].append(clock.spent[phase] / 1e6)
                time.sleep(interval / 2)
                beside()
        began = time.thread_time_ns()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        per_pass["sweep"] = [(time.thread_time_ns() - began) / 1e6 / GC_SWEEP_PASSES]
        kernel, counts = kernel_floor(clock, engine, loop, interval, passes)
    return {"phases": per_pass, "kernel": kernel, "counts": counts}


def kernel_floor(
    clock: PhaseClock, engine, loop: PassLoop, interval: float, repeats: int
) -> tuple[dict, str]:
    """What the kernel alone takes (ms) for the directories one more pass lists and the
    files it reads, by row: each listed and read again as bare system calls, nothing
    parsed, each row after a pause (the median of `repeats`)."""
    seen: dict[tuple[str, str], list] = defaultdict(list)
    procfs, module = engine.reader.procfs, collector.cgroupfs

    def recording(kind: str, call: Callable, path_of: Callable) -> Callable:
        def record(*args):
            seen[clock.phase, kind].append(path_of(*args))
            return call(*args)

        return record

    with (
        patch.object(procfs, "read", recording("file", procfs.read, lambda p: (p, None))),
        patch.object(procfs, "threads", recording("dir", procfs.threads, procfs.task_dir)),
        patch.object(module, "_read", recording("file", module._read, lambda *a: (*a, None)[:2])),
        patch.object(module, "subdirs", recording("dir", module.subdirs, lambda d: d)),
    ):
        time.sleep(interval)
        loop.run_pass()
    seen["list", "dir"].append(b"/proc")
    found: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for row in ("list", "cg-list", "cg-read", "read"):
            time.sleep(interval / 8)
            began = time.thread_time_ns()
            for path, dir_fd in seen[row, "file"]:
                _bare_read(path, dir_fd)
            for directory in seen[row, "dir"]:
                _listing(directory)
            found[row].append((time.thread_time_ns() - began) / 1e6)
    pids = {path.split(b"/")[2] for path, _ in seen["read", "file"]}
    counts = (
        f"one pass read {len(seen['read', 'file'])} files of {len(pids)} processes and listed "
        f"{len(seen['read', 'dir'])} task/ directories; read {len(seen['cg-read', 'file'])} "
        f"cgroup files, listed {len(seen['cg-list', 'dir']) + len(seen['cg-read', 'dir'])} "
        "cgroup directories"
    )
    return {row: statistics.median(times) for row, times in found.items()}, counts


def _listing(directory: bytes) -> None:
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            entry.inode()


def _bare_read(path: bytes, dir_fd: int | None = None) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.read(fd, 8192)
        finally:
            os.close(fd)


def floor_split(parts: dict[str, list[float]]) -> None:
    """One pass of the naive floor, split: listing /proc, listing every task/, the rest
    (ms, appended to `parts`): the listings alone, then both, then a whole naive pass."""

    def listing() -> list[str]:
        return [name for name in os.listdir("/proc") if name.isdigit()]

    def tasks() -> None:
        for name in listing():
            with contextlib.suppress(OSError):
                os.listdir(f"/proc/{name}/task")

    took = []
    for call in (listing, tasks, naive_pass):  # each after a pause, as a pass is
        time.sleep(0.02)
        began = time.thread_time_ns()
        call()
        took.append((time.thread_time_ns() - began) / 1e6)
    parts["list"].append(took[0])
    parts["tasks"].append(max(0.0, took[1] - took[0]))
    parts["read"].append(max(0.0, took[2] - took[1]))


def report(served: dict, floor: dict[str, list[float]], heading: str) -> str:
    def rows(title: str, labels: tuple, found: dict, kernel: dict) -> tuple[list[str], float]:
        medians = {phase: statistics.median(found[phase]) for phase, _ in labels}
        total = sum(medians.values())
        lines = [f"{title:42} {'ms':>7} {'share':>6} {'kernel-ms' if kernel else '':>9}"]
        for phase, label in labels:
            cell = f"{kernel[phase]:9.2f}" if phase in kernel else "-" if kernel else ""
            lines.append(
                f"{label:42} {medians[phase]:7.2f} {medians[phase] / total:6.3f} {cell:>9}"
            )
        return [*lines, f"{'total':42} {total:7.2f} {1:6.3f}", ""], total

    ours, total = rows("served pass", SERVED_ROWS, served["phases"], served["kernel"])
    naive, floor_total = rows("floor pass", FLOOR_ROWS, floor, {})
    ratio = f"served / floor: {total / floor_total:.3f}"
    lines = [heading, "", *ours, served["counts"], "", *naive, ratio]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector.bench.phases", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=110, help="pod cgroups (default 110)")
    parser.add_argument("--running", type=int, default=10, help="pods whose processes run")
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--interval", type=float, default=SERVED_INTERVAL)
    args = parser.parse_args(argv)
    if min(args.passes, args.processes, args.pods, args.warmup + 1) < 1:
        print("phases: --passes, --processes and --pods must be positive", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        parser.exit(1, "phases: needs root (it makes pod cgroups)\n")
    load = read_file("/proc/loadavg").split()[:3]
    with pid_room(args.processes * 3), pod_cgroups(args.pods) as pods_file:
        assert pods_file is not None  # made for --pods, positive (above)
        with (
            synthetic_table(args.processes, f"mixed:{args.running}", pods_file=pods_file),
            pod_names(pods_file) as (pod_logs, container_logs),
        ):
            options = Options(pod_logs=pod_logs, container_logs=container_logs)
            floor: dict[str, list[float]] = defaultdict(list)
            served = served_phases(
                options, args.passes, args.warmup, args.interval, lambda: floor_split(floor)
            )
            procs, threads = naive_pass()
    heading = (
        f"pods{args.running} N={args.processes}: {procs} processes, {threads} threads, "
        f"{args.pods} pod cgroups ({args.running} running); {args.passes} passes, "
        f"each phase's median CPU per pass; load average {b' '.join(load).decode()}"
    )
    print(report(served, floor, heading))
    return 0


if __name__ == "__main__":
    sys.exit(main())

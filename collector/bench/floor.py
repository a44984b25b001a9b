"""The floor every ratio of the bench is taken to, and the measured parties of a round.

The naive floor (`naive_pass`) is a lean reader of every file a full pass needs (`stat`
and `cgroup` per process; `schedstat`, `status` and `io` per thread) with minimal parsing.
Each party of a table's rounds (a variant of procdelta, or the floor) runs its passes in
a process of its own (`pass_worker`, started by `measured_apart`), as a collector does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from collector.wiring import Options, build_engine


def read_file(path: str) -> bytes:
    """Up to 8 KiB of a file, in one read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 8192)
    finally:
        os.close(fd)


def naive_pass(root: str = "/proc") -> tuple[int, int]:
    """The floor: every file a full pass needs, read once, split into fields. (procs, threads)"""
    processes = threads = 0
    for name in os.listdir(root):
        if not name.isdigit():
            continue
        base = f"{root}/{name}"
        try:
            stat = read_file(f"{base}/stat")
            stat[stat.rfind(b")") + 2 :].split()
            read_file(f"{base}/cgroup").split(b"\n")
            for tid in os.listdir(f"{base}/task"):
                task = f"{base}/task/{tid}"
                read_file(f"{task}/schedstat").split()
                read_file(f"{task}/status").split(b"\n")
                read_file(f"{task}/io").split(b"\n")
                threads += 1
        except OSError:
            continue
        processes += 1
    return processes, threads


@dataclass
class Sample:
    cpu: float
    wall: float


def _measure(action: Callable[[], object]) -> Sample:
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return Sample(time.process_time() - cpu, time.perf_counter() - wall)


def pass_worker(options: str) -> None:
    """One measured party of a table, in a process of its own: procdelta with `options`
    (`Options` as JSON), or (an empty string) the floor. Each line read runs one pass and
    answers its CPU and wall seconds; the end of its input ends it. A process of its own,
    as in a running collector: its garbage collector scans its own objects only
    (variants sharing one process would each pay for scanning the others' caches)."""
    action: Callable[[], object]
    if options:  # as `serve` builds it
        action = build_engine(Options(**json.loads(options)), freeze_gc=True).run_pass
    else:
        action = naive_pass
    for _ in sys.stdin:
        sample = _measure(action)
        print(sample.cpu, sample.wall, flush=True)


@contextlib.contextmanager
def measured_apart(parties: list[Options | None]) -> Iterator[list[Callable[[], Sample]]]:
    """One `pass_worker` per party; yields, for each, a call that runs one of its passes
    and returns its `Sample`. Every worker is ended and reaped on the way out."""
    started: list[subprocess.Popen[str]] = []

    def one_pass(worker: subprocess.Popen[str]) -> Sample:
        assert worker.stdin is not None and worker.stdout is not None  # PIPEs (below)
        worker.stdin.write("pass\n")
        worker.stdin.flush()
        answer = worker.stdout.readline().split()
        if len(answer) != 2:
            raise RuntimeError(f"a bench worker ended (status {worker.wait()})")
        return Sample(float(answer[0]), float(answer[1]))

    try:
        for options in parties:
            argument = "" if options is None else json.dumps(asdict(options))
            code = (
                "import sys; from collector.bench.floor import pass_worker; "
                "pass_worker(sys.argv[1])"
            )
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, argument],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        yield [functools.partial(one_pass, worker) for worker in started]
    finally:
        for worker in started:
            assert worker.stdin is not None and worker.stdout is not None  # PIPEs (above)
            with contextlib.suppress(OSError):
                worker.stdin.close()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            worker.stdout.close()


def thread_cpu_ns(pid: int) -> int:
    """On-CPU ns of every thread of another process, from its schedstat files."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            total += int(read_file(f"/proc/{pid}/task/{tid}/schedstat").split()[0])
    return total

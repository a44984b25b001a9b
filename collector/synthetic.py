"""A reproducible synthetic process table for the benchmark, run as its own process:

    python -m collector.synthetic PROCESSES THREADED_SHARE THREADS {idle,busy,mixed:R}
                                  [CGROUP_PROCS] [PODS_FILE]

It forks PROCESSES children; the first THREADED_SHARE of them run THREADS threads in all.
`idle` threads block for good (a node's usual state: most threads sleep); `busy` threads
wake every 100 ms and do a little work, so every thread moves between any two passes
that are more than 100 ms apart; `mixed:R` (with PODS_FILE) makes the processes of the
first R pods busy and the others idle.
With CGROUP_PROCS, the table puts itself in that cgroup first; with PODS_FILE (one line
per pod: the `cgroup.procs` files of its container, tab-separated, one per hierarchy),
child i moves itself into pod i modulo their number before it starts its threads. It
prints `ready` once every thread runs, and takes the whole table down when its stdin
closes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _thread_body(mode: str) -> None:
    if mode == "idle":
        threading.Event().wait()
    while True:
        time.sleep(0.1)
        sum(range(100))


def _child(threads: int, mode: str, ready_fd: int, procs_files: list[str]) -> None:
    for procs in procs_files:
        with open(procs, "w") as out:
            out.write(str(os.getpid()))
    threading.stack_size(256 * 1024)
    for _ in range(threads - 1):
        threading.Thread(target=_thread_body, args=(mode,), daemon=True).start()
    os.write(ready_fd, b".")
    os.close(ready_fd)
    if mode == "busy" and threads == 1:
        _thread_body(mode)
    while True:
        signal.pause()


def _mode(mode: str, index: int, pods: list[list[str]]) -> str:
    """A child's own mode: `mixed:R` is `busy` in the first R pods, `idle` elsewhere."""
    if not mode.startswith("mixed:"):
        return mode
    running = int(mode.split(":", 1)[1])
    return "busy" if pods and index % len(pods) < running else "idle"


def main(argv: list[str]) -> None:
    processes, share, threads, mode = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    if len(argv) > 4 and argv[4]:
        with open(argv[4], "w") as procs:
            procs.write(str(os.getpid()))
    pods: list[list[str]] = []
    if len(argv) > 5:
        with open(argv[5]) as lines:
            pods = [line.rstrip("\n").split("\t") for line in lines if line.strip()]
    os.setpgrp()
    threaded = round(processes * share)
    ready_r, ready_w = os.pipe()
    children = []
    for index in range(processes):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            pod = pods[index % len(pods)] if pods else []
            _child(threads if index < threaded else 1, _mode(mode, index, pods), ready_w, pod)
            os._exit(0)
        children.append(pid)
    os.close(ready_w)
    got = 0
    while got < processes:
        chunk = os.read(ready_r, processes)
        if not chunk:
            break
        got += len(chunk)
    time.sleep(0.2)
    print("ready", flush=True)
    try:
        sys.stdin.read()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])

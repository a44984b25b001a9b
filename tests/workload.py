"""A controllable workload for the kernel-truth tests, driven by lines on stdin.

    python workload.py --busy 4 --sleepers 2 [--idle N] [--churn DIR] [--cpu N]
                       [--busy-cpus N,N,...] [--storage FILE:BYTES] [--duty RUN_MS:EVERY_MS]
                       [--burst START_MS:RUN_MS] [--children RUN_MS] [--name-threads]

Busy threads hash a 1 MiB buffer (hashlib releases the GIL, so they really run in
parallel); sleeper threads sleep 1 ms in a loop and count their sleeps; idle threads
block; with --duty a thread runs RUN_MS of CPU time, then sleeps until EVERY_MS of wall
time since it began have passed (it wants RUN_MS/EVERY_MS of a CPU); with --churn a thread
keeps starting short-lived threads and children and writing to a file in DIR; with --cpu
every thread runs on that CPU only; with --busy-cpus the i-th busy thread runs on the i-th
CPU listed only (the scheduler's balancing then decides nothing about them); with --burst
the busy threads run only from START_MS to START_MS + RUN_MS of every second of wall time
(two workloads with windows apart burn in turns); with --children a thread keeps starting
child processes one after the other, each busy for RUN_MS of its own CPU time before it
exits (a pod whose work is short processes); with --storage
a thread (not the leader) writes BYTES to FILE with fsync, drops the file's pages from the
page cache and reads it back, so that storage really moved both ways, before "ready"; the
thread then blocks. With
--name-threads each busy, sleeper and idle thread names itself (its `comm`) busy-N,
sleeper-N, idle-N.
Commands:

    count           print the total number of sleeps done so far
    fork            fork a child that waits for orders; print its PID
    write PATH N    the child writes N bytes to PATH with fsync; print "written"
    reap            the child exits and this process reaps it; print "reaped"
    lives KIND WORKERS RUN_MS REPORT SECONDS
                    WORKERS loops for SECONDS, each starting short lives one after the
                    other (KIND: processes or threads), each busy RUN_MS of its own CPU
                    time, then appending what it ran and waited of itself, from its
                    schedstat, to the file REPORT ("on_cpu run_delay", ns) as it ends;
                    print "lived N"
    exit            stop
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time

sleeps = [0]
stop = threading.Event()


def busy(cpu: int | None = None, window: tuple[float, float] | None = None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # 0: the calling thread, not the whole process
    buffer = os.urandom(1 << 20)
    while not stop.is_set():
        if window is not None:
            start_ms, run_ms = window
            into = (time.time() * 1000 - start_ms) % 1000  # ms into this second's window
            if into >= run_ms:
                stop.wait((1000 - into) / 1000)
                continue
        hashlib.sha256(buffer).digest()


def children(run_ms: float) -> None:
    """Child processes one after the other, each busy `run_ms` of its own CPU time."""
    buffer = os.urandom(1 << 16)
    while not stop.is_set():
        pid = os.fork()
        if pid == 0:
            until = time.process_time() + run_ms / 1000
            while time.process_time() < until:
                hashlib.sha256(buffer).digest()
            os._exit(0)
        os.waitpid(pid, 0)


def self_reported() -> bytes:
    """The calling thread's on-CPU time and run delay (ns), as its `schedstat` gives them."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as stat:
        on_cpu, delay, _ = stat.read().split()
    return b"%s %s\n" % (on_cpu, delay)


def life(run_ms: float, report: int) -> None:
    """One short life: busy `run_ms` of its thread's CPU time, then what it ran and waited
    of itself appended to `report` (one write: atomic), just before it ends."""
    buffer = os.urandom(1 << 16)
    until = time.thread_time() + run_ms / 1000
    while time.thread_time() < until:
        hashlib.sha256(buffer).digest()
    os.write(report, self_reported())


def lives(kind: str, workers: int, run_ms: float, report_path: str, seconds: float) -> int:
    """`workers` loops side by side for `seconds`, each starting short lives one after the
    other (child processes or threads of this process: `kind`); the lives they started."""
    report = os.open(report_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    deadline = time.monotonic() + seconds
    started = [0] * workers

    def loop(index: int) -> None:
        while time.monotonic() < deadline:
            started[index] += 1
            if kind == "threads":
                thread = threading.Thread(target=life, args=(run_ms, report))
                thread.start()
                thread.join()
                continue
            pid = os.fork()
            if pid == 0:
                life(run_ms, report)
                os._exit(0)
            os.waitpid(pid, 0)

    loops = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for thread in loops:
        thread.start()
    for thread in loops:
        thread.join()
    os.close(report)
    return sum(started)


def sleeper(index: int) -> None:
    count = 0
    while not stop.is_set():
        time.sleep(0.001)
        count += 1
        sleeps[index] = count


def duty(run_ms: float, every_ms: float) -> None:
    """Busy for `run_ms` (by the thread's own CPU clock), then asleep until `every_ms` of
    wall time have passed since the burst began: a thread that wants run/every of a CPU."""
    buffer = os.urandom(1 << 16)
    while not stop.is_set():
        began = time.monotonic()
        until = time.thread_time() + run_ms / 1000
        while time.thread_time() < until:
            hashlib.sha256(buffer).digest()
        rest = every_ms / 1000 - (time.monotonic() - began)
        if rest > 0:
            stop.wait(rest)


def idle() -> None:
    stop.wait()


def named(name: str, target, *args) -> None:
    """Run `target` in a thread that first gives itself `name` (its `comm`, as
    /proc/<pid>/task/<tid>/stat shows it)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write(name)
    target(*args)


def churn(directory: str) -> None:
    """Every ~20 ms: a short-lived thread, a short-lived child process, a small write."""
    path = os.path.join(directory, f"churn-{os.getpid()}")
    n = 0
    while not stop.is_set():
        n += 1
        threading.Thread(target=lambda: sum(range(20000)), daemon=True).start()
        if n % 3 == 0:
            pid = os.fork()
            if pid == 0:
                sum(range(50000))
                os._exit(0)
            os.waitpid(pid, 0)
        if n % 5 == 0:
            with open(path, "ab") as out:
                out.write(os.urandom(65536))
                os.fsync(out.fileno())
        time.sleep(0.02)
    os.unlink(path)


def storage(path: str, size: int, done: threading.Event) -> None:
    """Write `size` bytes to storage and read them back from storage, not from the cache;
    then stay alive (blocked), so that the bytes stay in this thread's own `io`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = os.urandom(1 << 20)
        written = 0
        while written < size:
            written += os.write(fd, chunk[: size - written])
        os.fsync(fd)  # clean pages: the next call can drop them
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
        os.unlink(path)
        done.set()
    stop.wait()


def child_loop(orders: int, acks: int) -> None:
    with os.fdopen(orders, "r") as commands:
        for line in commands:
            parts = line.split()
            if parts[0] == "write":
                path, size = parts[1], int(parts[2])
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                chunk = os.urandom(1 << 20)
                written = 0
                while written < size:
                    written += os.write(fd, chunk[: size - written])
                os.fsync(fd)
                os.close(fd)
                os.write(acks, b"written\n")
            elif parts[0] == "exit":
                break
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--sleepers", type=int, default=0)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument(
        "--duty", metavar="RUN_MS:EVERY_MS", help="one thread busy RUN_MS of every EVERY_MS"
    )
    parser.add_argument("--churn", metavar="DIR", help="churn threads, children and writes")
    parser.add_argument("--cpu", type=int, help="run on this CPU only")
    parser.add_argument(
        "--busy-cpus", metavar="N,N,...", help="the i-th busy thread on the i-th CPU only"
    )
    parser.add_argument(
        "--burst", metavar="START_MS:RUN_MS", help="busy threads run in this window of a second"
    )
    parser.add_argument("--children", type=float, metavar="RUN_MS", help="busy children")
    parser.add_argument("--storage", metavar="FILE:BYTES", help="write, then read from storage")
    parser.add_argument("--name-threads", action="store_true", help="busy-N, sleeper-N, idle-N")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    sleeps[:] = [0] * args.sleepers
    cpus = [int(n) for n in args.busy_cpus.split(",")] if args.busy_cpus else []
    if cpus and len(cpus) != args.busy:
        parser.error(f"--busy-cpus lists {len(cpus)} CPUs for {args.busy} busy threads")
    window = tuple(float(n) for n in args.burst.split(":")) if args.burst else None
    targets = [(f"busy-{i}", busy, (cpus[i] if cpus else None, window)) for i in range(args.busy)]
    targets += [(f"sleeper-{i}", sleeper, (i,)) for i in range(args.sleepers)]
    targets += [(f"idle-{i}", idle, ()) for i in range(args.idle)]
    threads = [
        threading.Thread(target=named, args=(name, target, *rest), daemon=True)
        if args.name_threads
        else threading.Thread(target=target, args=rest, daemon=True)
        for name, target, rest in targets
    ]
    if args.duty:
        run_ms, every_ms = (float(n) for n in args.duty.split(":"))
        threads.append(threading.Thread(target=duty, args=(run_ms, every_ms), daemon=True))
    if args.churn:
        threads.append(threading.Thread(target=churn, args=(args.churn,), daemon=True))
    if args.children:
        threads.append(threading.Thread(target=children, args=(args.children,), daemon=True))
    for thread in threads:
        thread.start()
    if args.storage:
        path, size = args.storage.rsplit(":", 1)
        moved = threading.Event()
        threading.Thread(target=storage, args=(path, int(size), moved), daemon=True).start()
        moved.wait()
    child = None
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "count":
            print(sum(sleeps), flush=True)
        elif parts[0] == "fork":
            orders_r, orders_w = os.pipe()
            acks_r, acks_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(orders_w)
                os.close(acks_r)
                child_loop(orders_r, acks_w)
            os.close(orders_r)
            os.close(acks_w)
            child = (pid, os.fdopen(orders_w, "w"), os.fdopen(acks_r, "r"))
            print(pid, flush=True)
        elif parts[0] == "write":
            child[1].write(line)
            child[1].flush()
            print(child[2].readline().strip(), flush=True)
        elif parts[0] == "lives":  # lives KIND WORKERS RUN_MS REPORT SECONDS
            kind, workers, run_ms, report, seconds = parts[1:]
            assert kind in ("processes", "threads"), kind
            count = lives(kind, int(workers), float(run_ms), report, float(seconds))
            print(f"lived {count}", flush=True)
        elif parts[0] == "reap":
            child[1].write("exit\n")
            child[1].flush()
            os.waitpid(child[0], 0)
            print("reaped", flush=True)
        elif parts[0] == "exit":
            break
    stop.set()


if __name__ == "__main__":
    main()

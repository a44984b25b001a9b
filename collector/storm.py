"""A paced storm of task exits for the benchmark, run as its own process:

    python -m collector.storm RATE [FORK_EVERY]

It makes RATE task exits a second, as evenly as a tick of a millisecond allows: short
threads and, one exit in FORK_EVERY (0: none), a forked child. Each thread is a bare
pthread whose start routine is libc's `getpid`: it runs no Python and exits as soon as it
starts (~40 µs of the storm's CPU an exit, where a Python thread would cost ~4 times as
much and crowd a small machine's CPUs before the rate is reached); each child exits at
once and is reaped. The
exits it could not make in their tick (the machine was busy) are not made up for later,
beyond a tenth of a second: the rate it reached is what it counted. It prints `ready`, then
answers each line read on stdin with one line, `MADE CPU_NS AT_NS`: the exits made so far,
its CPU (its own threads', gone ones included, and its reaped children's: the kernel's work
for each exit, an exit record sent included, is the exiting task's) and the monotonic
instant; it stops when its stdin closes. Out of `bench/` as collector/synthetic.py is: its
children fork from a bare interpreter.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import select
import sys
import time
import warnings

TICK_NS = 1_000_000
CATCH_UP_NS = 100_000_000  # exits due longer ago than this are not made any more


class Threads:
    """Threads that exit as they start: `pthread_create` with libc's `getpid` as the start
    routine (it takes no argument and returns at once), detached so that nothing joins
    them."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._create = libc.pthread_create
        self._create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._detach = libc.pthread_detach
        self._detach.argtypes = [ctypes.c_ulong]
        self._start = ctypes.cast(libc.getpid, ctypes.c_void_p)
        self._thread = ctypes.c_ulong()
        self._where = ctypes.byref(self._thread)

    def make(self) -> bool:
        """One thread started (and so, in a moment, one exit); False where the system
        refused it (EAGAIN: its threads or PIDs ran out for a moment)."""
        if self._create(self._where, None, self._start, None):
            return False
        self._detach(self._thread.value)
        return True


def fork_one() -> bool:
    """One child, exiting at once (reaped by `reap`)."""
    try:
        child = os.fork()
    except OSError as error:
        if error.errno == errno.EAGAIN:
            return False
        raise
    if child == 0:  # pragma: no cover (the child)
        os._exit(0)
    return True


def reap() -> None:
    while True:
        try:
            child, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if child == 0:
            return


def cpu_ns() -> int:
    """This process's CPU: its threads', gone ones included, and its reaped children's."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    seconds = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return round(seconds * 1e9)


def storm(rate: float, fork_every: int) -> None:
    """Exits at `rate` a second until stdin closes, answering each line read on it."""
    threads = Threads()
    # a fork while the storm's bare threads come and go copies only the forking thread,
    # which holds everything the child needs (it only exits)
    warnings.filterwarnings("ignore", ".*multi-threaded.*fork", DeprecationWarning)
    made = skipped = 0  # skipped: exits due that were given up (`CATCH_UP_NS`)
    backlog = max(1, int(rate * CATCH_UP_NS / 1e9))
    tick_s = max(TICK_NS, 1e9 / rate if rate > 0 else TICK_NS) / 1e9
    print("ready", flush=True)
    began = time.monotonic_ns()
    pending = b""
    while True:
        due = int((time.monotonic_ns() - began) * rate / 1e9) - skipped
        if due - made > backlog:
            skipped += due - made - backlog
            due = made + backlog
        while made < due:
            forked = fork_every > 0 and made % fork_every == fork_every - 1
            if not (fork_one() if forked else threads.make()):
                break
            made += 1
        reap()
        readable, _, _ = select.select([0], [], [], tick_s)
        if not readable:
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return
        pending += chunk
        for _ in range(pending.count(b"\n")):
            os.write(1, b"%d %d %d\n" % (made, cpu_ns(), time.monotonic_ns()))
        pending = pending.rpartition(b"\n")[2]


def main(argv: list[str]) -> None:
    rate = float(argv[0])
    fork_every = int(argv[1]) if len(argv) > 1 else 0
    try:
        storm(rate, fork_every)
    finally:
        reap()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where an exit record's cost goes, step by step: `python -m collector.bench.exitpath`.

Each step of a record's way through a served process, timed in this process over many
records on the thread's own CPU clock (no root, no kernel records: datagrams in the
kernel's layout, `tests/exitrecords.py`'s shape, made here): reading one datagram off a
socket, and the kernel's own datagrams off a netlink socket one a call and in batches (the
listener's way, `recvmmsg`); taking it the way the listener does now
(`ExitListener._take_one`: folded as a thread no pass reads, or queued); the way it did
before folding (`parse_messages` into a packed record, then `Tracker.close` in the pass,
each record one by one); and a wake-up of a thread that sleeps and is woken (what a record
costs where records come one at a time). Each is printed in µs and as a ratio to the
cheapest step measured in the same run, reading a datagram, so that the ratios hold from
one machine to another.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time

from collector import datagrams
from collector.exits import (
    AGROUP,
    NETLINK_GENERIC,
    TASKSTATS_CMD_NEW,
    TASKSTATS_TYPE_AGGR_PID,
    TASKSTATS_TYPE_PID,
    TASKSTATS_TYPE_STATS,
    ExitListener,
    ExitRecords,
    family_request,
    pack_stats,
    parse_messages,
)
from collector.model import ProcessReading, ThreadReading
from collector.tracker import Tracker

FAMILY = 23
HZ = 100
SEC = 10**9


def taskstats(pid: int, tgid: int, *, last: bool, lived_us: int, group_lived_us: int) -> bytes:
    """A `struct taskstats` of version 16 (560 bytes) at the kernel's x86-64 offsets."""
    data = bytearray(560)
    struct.pack_into("=H2xIB", data, 0, 16, 0, AGROUP if last else 0)
    struct.pack_into("=Q", data, 24, 1234)  # run delay
    struct.pack_into("=Q", data, 72, 567_890)  # on-CPU
    data[80:84] = b"task"
    struct.pack_into("=II", data, 128, pid, 1)
    struct.pack_into("=QQQ8xQ", data, 144, lived_us, 300, 200, 0)
    struct.pack_into("=QQ8xQQ", data, 248, 0, 4096, 2, 1)
    struct.pack_into("=I4xQ", data, 368, tgid, group_lived_us)
    return bytes(data)


def message(stats: bytes, pid: int) -> bytes:
    def attribute(kind: int, value: bytes) -> bytes:
        length = 4 + len(value)
        return struct.pack("=HH", length, kind) + value + b"\0" * (-length % 4)

    inner = attribute(TASKSTATS_TYPE_PID, struct.pack("=I", pid))
    inner += attribute(TASKSTATS_TYPE_STATS, stats)
    body = struct.pack("=BBH", TASKSTATS_CMD_NEW, 1, 0) + attribute(TASKSTATS_TYPE_AGGR_PID, inner)
    return struct.pack("=IHHII", 16 + len(body), FAMILY, 0, 0, 0) + body


class Quiet:
    """A socket that is never read: the listener is driven step by step here."""

    def settimeout(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


def per_call(step, count: int) -> float:
    """µs of this thread's CPU a call of `step(i)`, over `count` calls."""
    began = time.thread_time_ns()
    for i in range(count):
        step(i)
    return (time.thread_time_ns() - began) / count / 1000


def reading_a_datagram(data: bytes, count: int) -> float:
    """µs to read one datagram off a socket that holds some (a Unix socket holds at most
    `net.unix.max_dgram_qlen`, 10 by default: they are sent and read 8 at a time)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    buffer = bytearray(1 << 16)
    try:
        total, batches = 0.0, count // 8
        for _ in range(batches):
            for _ in range(8):
                theirs.send(data)
            total += per_call(lambda i: ours.recvfrom_into(buffer), 8) * 8
        return total / (batches * 8)
    finally:
        ours.close()
        theirs.close()


def reading_the_kernels(count: int, batched: bool, at_once: int = 100) -> float:
    """µs to read one of the kernel's own datagrams off a netlink socket: its answers to
    `CTRL_CMD_GETFAMILY` (no root), asked for `at_once` at a time, read one a call
    (`recvfrom_into`) or in batches (`recvmmsg`: collector/datagrams.py)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    try:
        sock.bind((0, 0))
        sock.setblocking(False)
        reader = datagrams.Batches(sock) if batched else datagrams.OneByOne(sock)
        request = family_request(1)
        spent = read = 0
        while read < count:
            for _ in range(at_once):
                sock.send(request)  # answered in the send
            began = time.thread_time_ns()
            while True:
                try:
                    read += reader.receive()
                except BlockingIOError:
                    break
            spent += time.thread_time_ns() - began
        return spent / read / 1000
    finally:
        sock.close()


def taking_now(data: bytes, count: int) -> float:
    listener = ExitListener(clock=time.monotonic_ns, sock=Quiet(), family=FAMILY)  # type: ignore[arg-type]
    listener.pass_read(0)
    buffer = bytearray(data)
    return per_call(lambda i: listener._take_one(buffer, 0, len(data), 10**15, 1000), count)


def taking_before(pid: int, data: bytes, count: int) -> float:
    """Before folding: each datagram read into a packed record, queued; the pass makes a
    record of each and closes it (`Tracker.close`) against a cache holding its process."""
    queue = bytearray()

    def take(i: int) -> None:
        nonlocal queue
        records, _ = parse_messages(data, 10**15, lambda s, r: pack_stats(s, r, 1000))
        queue += b"".join(records)

    listening = per_call(take, count)
    tracker = Tracker(HZ)
    tracker.keeps_replaced = True
    start_ticks = (10**15 - 100 * SEC) * HZ // SEC
    leader = ThreadReading(pid, start_ticks, 1, 1, 1, 1, 1, 1, 1)
    process = ProcessReading(pid, "p", start_ticks, 10**15 - SEC, 1, 1, 1, 1, b"0::/a\n", (leader,))
    tracker.advance([process], 10**15 - 2 * SEC, read_until_ns=10**15 - SEC)
    records = ExitRecords(queue)
    began = time.thread_time_ns()
    tracker.close(records, sink=lambda delta: None)
    closing = (time.thread_time_ns() - began) / len(records) / 1000
    return listening + closing


def a_wake_up(count: int) -> float:
    """µs of a thread's own CPU for each time it is woken from a sleep (`Event.wait`)."""
    woken, done = threading.Event(), threading.Event()
    spent = []

    def sleeper() -> None:
        began = time.thread_time_ns()
        for _ in range(count):
            woken.wait()
            woken.clear()
            done.set()
        spent.append((time.thread_time_ns() - began) / count / 1000)

    thread = threading.Thread(target=sleeper)
    thread.start()
    for _ in range(count):
        time.sleep(0.001)
        woken.set()
        done.wait()
        done.clear()
    thread.join()
    return spent[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector.bench.exitpath", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--records", type=int, default=50_000, help="records a step")
    args = parser.parse_args(argv)
    if args.records < 1000:
        print("exitpath: --records must be 1000 or more", file=sys.stderr)
        return 2
    count = args.records
    thread = message(taskstats(501, 400, last=False, lived_us=10, group_lived_us=100), 501)
    last = message(taskstats(502, 502, last=True, lived_us=10, group_lived_us=10), 502)
    read = reading_a_datagram(thread, count)
    rows = [
        ("reading a datagram off a socket", read),
        ("the kernel's, off netlink, one a call", reading_the_kernels(count, batched=False)),
        ("the kernel's, off netlink, in batches", reading_the_kernels(count, batched=True)),
        ("taking it now, a thread no pass reads: folded", taking_now(thread, count)),
        ("taking it now, a process's last task: queued", taking_now(last, count)),
        ("before: parsed, packed, queued, closed in the pass", taking_before(501, thread, count)),
        ("a wake-up of a sleeping thread", a_wake_up(min(count, 2000))),
    ]
    print(f"{'step':<52} {'µs':>7} {'of reading':>10}")
    for name, micros in rows:
        print(f"{name:<52} {micros:>7.2f} {micros / read:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The kernel's exit records as a test writes them (TASKSTATS netlink messages, at the kernel's
offsets) for tests/unit/test_exits.py, test_tracker_close.py and test_engine_exits.py."""

from __future__ import annotations

import socket
import struct
from collections import Counter, deque

from collector.exits import (
    AGROUP,
    TASKSTATS_TYPE_AGGR_PID,
    TASKSTATS_TYPE_PID,
    TASKSTATS_TYPE_STATS,
    ExitRecords,
    Fold,
    parse_stats,
)

STATS_BYTES = 560  # version 16's size, on 6.18


def taskstats(
    pid: int,
    tgid: int | None = None,
    ppid: int = 1,
    *,
    version: int = 16,
    last: bool = True,
    lived_us: int = 0,
    group_lived_us: int | None = None,
    on_cpu: int = 0,
    delay: int = 0,
    vol: int = 0,
    invol: int = 0,
    rd: int = 0,
    wr: int = 0,
    utime_us: int = 0,
    stime_us: int = 0,
    majflt: int = 0,
    comm: bytes = b"task",
) -> bytes:
    """A `struct taskstats` as the kernel lays it out (include/uapi/linux/taskstats.h,
    x86-64 offsets, checked against the header with offsetof)."""
    data = bytearray(STATS_BYTES)
    struct.pack_into("=H2xIB", data, 0, version, 0, AGROUP if last else 0)
    struct.pack_into("=Q", data, 24, delay)
    struct.pack_into("=Q", data, 72, on_cpu)
    data[80 : 80 + len(comm)] = comm
    struct.pack_into("=II", data, 128, pid, ppid)
    struct.pack_into("=QQQ8xQ", data, 144, lived_us, utime_us, stime_us, majflt)
    struct.pack_into("=QQ8xQQ", data, 248, rd, wr, vol, invol)
    struct.pack_into("=I4xQ", data, 368, tgid if tgid is not None else pid,
                     group_lived_us if group_lived_us is not None else lived_us)  # fmt: skip
    return bytes(data)


def attribute(kind: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return struct.pack("=HH", length, kind) + value + b"\0" * (-length % 4)


FAMILY = 23  # the TASKSTATS family's number the tests' listeners are given


def message(*attributes: bytes, kind: int = FAMILY, command: int = 2) -> bytes:
    body = struct.pack("=BBH", command, 1, 0) + b"".join(attributes)  # TASKSTATS_CMD_NEW
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def exit_message(stats: bytes, pid: int) -> bytes:
    return message(
        attribute(
            TASKSTATS_TYPE_AGGR_PID,
            attribute(TASKSTATS_TYPE_PID, struct.pack("=I", pid))
            + attribute(TASKSTATS_TYPE_STATS, stats),
        )
    )


START = 5_000  # ticks: 50 s since boot


def record(pid, tgid=None, *, at, lived, last=True, ppid=1, group_lived=None, waited=0,
           **counters):  # fmt: skip
    """An exit record received at `at` (ns) of a task that lived `lived` ns, after waiting
    at most `waited` ns in the socket."""
    stats = taskstats(
        pid,
        tgid,
        ppid,
        last=last,
        lived_us=lived // 1000,
        group_lived_us=(group_lived if group_lived is not None else lived) // 1000,
        **counters,
    )
    found = parse_stats(stats, at, waited)
    assert found is not None
    return found


class Netlink:
    """A socket as the listener reads one (`recvfrom_into`): each datagram comes with its
    sender's address, (port id, groups), port 0 being the kernel's. Made of an AF_UNIX
    pair, so that `select` waits on it as on the kernel's."""

    def __init__(self):
        self._theirs, self._ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._ours.settimeout(0.05)
        self._ports: deque[int] = deque()

    def send(self, data: bytes, port: int = 0) -> None:
        self._ports.append(port)
        self._theirs.send(data)

    def recvfrom_into(self, buffer) -> tuple[int, tuple[int, int]]:
        size = self._ours.recv_into(buffer)
        return size, (self._ports.popleft(), 0)

    def settimeout(self, seconds) -> None:
        self._ours.settimeout(seconds)

    def fileno(self) -> int:
        return self._ours.fileno()

    def close(self) -> None:
        self._ours.close()
        self._theirs.close()


class QueuedListener:
    """A listener (collector/exits.py, `ExitListener`) whose records and folds are the
    ones a test queues (`queue`: packed records; `folds`), and whose losses it sets."""

    overflows = dropped = 0

    def __init__(self):
        self.queue: list[bytes] = []
        self.folds: list[Fold] = []
        self.lost: Counter[int] = Counter()
        self.refused: Counter[str] = Counter()

    def take(self) -> tuple[ExitRecords, list[Fold]]:
        queue, self.queue = self.queue, []
        folds, self.folds = self.folds, []
        return ExitRecords(b"".join(queue)), folds

    def take_lost(self) -> Counter[int]:
        lost, self.lost = self.lost, Counter()
        return lost

    def pass_began(self) -> None:
        pass

    def pass_read(self, read_until_ns: int) -> None:
        pass

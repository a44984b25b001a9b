"""The exit records off the socket (collector/exits.py): each record read at the kernel's
offsets, messages taken apart at their boundaries, records held packed up to the listener's
bound, and an overflow or a stray message counted while listening goes on."""

from __future__ import annotations

import errno
import struct
import time
from collections import Counter

from collector import exits
from collector.exits import (
    TASKSTATS_TYPE_AGGR_PID,
    TASKSTATS_TYPE_AGGR_TGID,
    TASKSTATS_TYPE_PID,
    TASKSTATS_TYPE_STATS,
    TASKSTATS_TYPE_TGID,
    ExitListener,
    ExitRecord,
    ExitRecords,
    pack_stats,
    parse_messages,
    parse_stats,
)
from tests.exitrecords import FAMILY, Netlink, attribute, exit_message, message, taskstats
from tests.unit.test_tracker import SEC


def test_a_record_is_read_at_the_kernels_offsets():
    stats = taskstats(42, 40, ppid=7, lived_us=1500, group_lived_us=9000, on_cpu=11, delay=22,
                      vol=3, invol=4, rd=512, wr=1024, utime_us=8000, stime_us=4000, majflt=2,
                      comm=b"awk")  # fmt: skip
    record = parse_stats(stats, received_ns=10 * SEC)
    assert record == ExitRecord(
        pid=42, tgid=40, ppid=7, last=True, comm="awk", received_ns=10 * SEC,
        lived_ns=1_500_000, group_lived_ns=9_000_000, on_cpu_ns=11, run_delay_ns=22,
        voluntary_switches=3, nonvoluntary_switches=4, read_bytes=512, write_bytes=1024,
        utime_us=8000, stime_us=4000, major_faults=2,
    )  # fmt: skip
    assert record.start_ns == 10 * SEC - 1_500_000
    assert record.group_start_ns == 10 * SEC - 9_000_000


def test_a_record_before_version_12_has_no_tgid_and_a_short_one_is_none():
    old = parse_stats(taskstats(42, 40, version=11), 0)
    assert old is not None and old.tgid == 0 and old.group_lived_ns == old.lived_ns
    assert parse_stats(b"\0" * 100, 0) is None


def test_messages_give_their_tasks_records_not_their_processes_sums():
    """Each exiting task's AGGR_PID holds its own record; a multi-threaded process's
    AGGR_TGID, sent with its last task, holds the delay sums of its tasks again: not taken.
    Messages are taken one after another, each padded to four bytes."""
    one = exit_message(taskstats(42, 40, last=False, on_cpu=5), 42)
    two = message(
        attribute(
            TASKSTATS_TYPE_AGGR_PID,
            attribute(TASKSTATS_TYPE_PID, struct.pack("=I", 40))
            + attribute(TASKSTATS_TYPE_STATS, taskstats(40, 40, on_cpu=7)),
        ),
        attribute(
            TASKSTATS_TYPE_AGGR_TGID,
            attribute(TASKSTATS_TYPE_TGID, struct.pack("=I", 40))
            + attribute(TASKSTATS_TYPE_STATS, taskstats(40, 40, on_cpu=12)),
        ),
    )
    records, error = parse_messages(one + two, 5)
    assert [(r.pid, r.on_cpu_ns, r.last) for r in records] == [(42, 5, False), (40, 7, True)]
    assert error is None


def test_records_are_held_packed_and_read_back_whole():
    stats = [taskstats(40 + i, 40, ppid=7, lived_us=1500 + i, on_cpu=11 * i, delay=22 * i,
                       rd=512 * i, comm=b"a-very-long-command-name") for i in range(3)]  # fmt: skip
    # the kernel's names are 15 bytes at most (TASK_COMM_LEN): 16 are held
    held = ExitRecords(b"".join(pack_stats(s, 10 * SEC + i) for i, s in enumerate(stats)))
    assert len(held) == 3 and held.packed.__len__() == 3 * exits.PACKED_BYTES
    assert list(held) == [parse_stats(s, 10 * SEC + i) for i, s in enumerate(stats)]
    assert list(held) == list(held)  # iterated again, the same
    assert held[1].pid == 41 and held[-1].on_cpu_ns == 22 and held[0].comm == "a-very-long-comm"


def test_the_listener_holds_at_most_its_bound_and_counts_the_rest(monkeypatch):
    """Records past MAX_QUEUED between two passes are dropped, newest first, and counted;
    a drain empties the queue; closing stops the thread."""
    monkeypatch.setattr(exits, "MAX_QUEUED", 5)
    kernel = Netlink()
    listener = ExitListener(clock=lambda: 10 * SEC, sock=kernel, family=FAMILY).listen()
    try:
        for pid in range(100, 108):  # one message a read, as the kernel sends them
            kernel.send(exit_message(taskstats(pid, lived_us=1000), pid))
        deadline = time.monotonic() + 10
        while listener.received < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (listener.received, listener.dropped) == (8, 3)
        assert [r.pid for r in listener.drain()] == [100, 101, 102, 103, 104]
        kernel.send(exit_message(taskstats(200, lived_us=1000), 200))
        while listener.received < 9 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.pid for r in listener.drain()] == [200] and listener.dropped == 3
    finally:
        listener.close()
        kernel.close()
    assert not listener._thread.is_alive()


def test_an_error_message_says_its_code():
    error = struct.pack("=IHHII", 36, 2, 0, 0, 0) + struct.pack("=i", -1) + b"\0" * 16
    ack = struct.pack("=IHHII", 36, 2, 0, 0, 0) + struct.pack("=i", 0) + b"\0" * 16
    assert parse_messages(error, 0) == ([], 1)  # EPERM
    assert parse_messages(ack, 0) == ([], 0)
    assert parse_messages(b"\x10\0\0", 0) == ([], None)  # cut short: nothing


def test_the_last_task_is_the_kernels_agroup_bit_and_tgid_comes_from_version_12():
    stats = bytearray(taskstats(42, 40, version=12, last=False))
    stats[8] = 0x20  # include/uapi/linux/acct.h: AGROUP
    got = parse_stats(bytes(stats), 0)
    assert got is not None and got.last and got.tgid == 40


def test_attributes_and_messages_are_taken_at_four_byte_boundaries():
    inner = (attribute(7, b"abc") + attribute(TASKSTATS_TYPE_PID, struct.pack("=I", 42))
             + attribute(TASKSTATS_TYPE_STATS, taskstats(42)))  # fmt: skip
    exit42 = message(attribute(TASKSTATS_TYPE_AGGR_PID, inner))
    noop = struct.pack("=IHHII", 17, 1, 0, 0, 0) + b"x" + b"\0" * 3  # NLMSG_NOOP, padded
    assert [r.pid for r in parse_messages(noop + exit42, 0)[0]] == [42]


class Overflowing:
    """A socket whose first two reads overflow, then gives one record."""

    def __init__(self, then: bytes):
        self.calls, self.then = 0, then

    def recvfrom_into(self, buffer):
        self.calls += 1
        if self.calls <= 2:
            raise OSError(errno.ENOBUFS, "No buffer space available")
        if self.calls == 3:
            buffer[: len(self.then)] = self.then
            return len(self.then), (0, 0)
        time.sleep(0.01)
        raise TimeoutError

    def settimeout(self, seconds):
        pass

    def close(self):
        pass


def test_an_overflow_is_counted_and_listening_goes_on():
    sock = Overflowing(exit_message(taskstats(300, lived_us=1000), 300))
    listener = ExitListener(clock=lambda: 10 * SEC, sock=sock).listen()
    try:
        deadline = time.monotonic() + 5
        while listener.received < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.overflows == 2 and [r.pid for r in listener.drain()] == [300]
    finally:
        listener.close()


def test_a_message_no_kernel_sends_is_counted_and_listening_goes_on():
    kernel = Netlink()
    listener = ExitListener(clock=lambda: 10 * SEC, sock=kernel, family=FAMILY).listen()
    try:
        kernel.send(struct.pack("=IHHII", 16, 2, 0, 0, 0))  # NLMSG_ERROR with no code
        kernel.send(exit_message(taskstats(301, lived_us=1000), 301))
        deadline = time.monotonic() + 5
        while listener.received < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [r.pid for r in listener.drain()] == [301]
        assert listener.refused == Counter(malformed=1)
        assert listener._thread.is_alive()
    finally:
        listener.close()
        kernel.close()


def forged(pid: int = 302) -> bytes:
    """A well-formed exit record of an hour on a CPU, as another process could write it."""
    hour = taskstats(pid, lived_us=1000, on_cpu=3600 * SEC, utime_us=3600 * 10**6)
    return exit_message(hour, pid)


def test_only_the_kernel_speaks_a_record_from_another_port_is_refused():
    """A process with CAP_NET_ADMIN may send to the listener's port: whatever it sends,
    its port id is not the kernel's 0, and nothing of it is taken."""
    kernel = Netlink()
    listener = ExitListener(clock=lambda: 10 * SEC, sock=kernel, family=FAMILY).listen()
    try:
        kernel.send(forged(302), port=4242)
        kernel.send(forged(303), port=0x80000001)  # an autobound port, as the kernel makes
        kernel.send(exit_message(taskstats(304, lived_us=1000), 304))  # the kernel's
        deadline = time.monotonic() + 5
        while listener.received < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert [r.pid for r in listener.drain()] == [304]
        assert listener.refused == Counter(not_kernel=2) and listener.received == 1
    finally:
        listener.close()
        kernel.close()


def aggr_pid(pid_attribute: bytes | None, stats: bytes) -> bytes:
    inner = b"" if pid_attribute is None else attribute(TASKSTATS_TYPE_PID, pid_attribute)
    inner += attribute(TASKSTATS_TYPE_STATS, stats)
    return message(attribute(TASKSTATS_TYPE_AGGR_PID, inner))


def test_a_message_of_another_family_or_command_or_shape_is_refused_by_reason():
    """The kernel's record is a TASKSTATS_CMD_NEW of the family's number, its AGGR_PID
    holding a PID attribute and a STATS of that very PID, long enough to be read: each
    other shape is refused and counted, the well-formed record beside it still taken."""
    well = exit_message(taskstats(40, lived_us=1000), 40)
    cases = [
        (message(attribute(TASKSTATS_TYPE_AGGR_PID, b""), kind=FAMILY + 1), "not_taskstats"),
        (exit_message(taskstats(41), 41)[:16] + b"\1\1\0\0" + exit_message(taskstats(41), 41)[20:],
         "not_taskstats"),  # TASKSTATS_CMD_GET: a request, never an exit record
        (aggr_pid(None, taskstats(42)), "malformed"),  # no PID attribute
        (aggr_pid(struct.pack("=I", 43), taskstats(44)), "malformed"),  # another task's
        (aggr_pid(struct.pack("=I", 45), taskstats(45)[:200]), "malformed"),  # cut short
    ]  # fmt: skip
    for data, reason in cases:
        refused: Counter[str] = Counter()
        records, _ = parse_messages(data + well, 0, family=FAMILY, refused=refused)
        assert [r.pid for r in records] == [40], reason
        assert refused == Counter({reason: 1}), reason

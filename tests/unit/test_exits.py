"""The exit records off the socket (collector/exits.py): each record read at the kernel's
offsets, messages taken apart at their boundaries, records held packed up to the listener's
bound, and an overflow or a stray message counted while listening goes on."""

from __future__ import annotations

import errno
import struct
import time
from collections import Counter

import pytest

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
    next_gather,
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


class Clock:
    """CLOCK_BOOTTIME for a listener: `now`, moved by the test."""

    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


def taken(listener: ExitListener, count: int) -> None:
    deadline = time.monotonic() + 5
    while listener.received < count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert listener.received == count


def test_threads_no_pass_reads_are_folded_by_process_the_rest_queued():
    """After a pass that had read every process by 9 s: the records of threads begun after
    it (not their process's last task) fold into one `Fold` per process as they come; a
    process's last task, a leader, a thread begun before 9 s, and anything that comes once
    the next pass began listing are queued for it, as before."""
    kernel, clock = Netlink(), Clock(10 * SEC)
    listener = ExitListener(clock=clock, sock=kernel, family=FAMILY).listen()
    try:
        listener.pass_read(9 * SEC)
        ms = 1000  # µs
        threads = [taskstats(500 + i, 400, ppid=7, last=False, lived_us=10 * ms,
                             group_lived_us=5_000 * ms, on_cpu=1000 + i, delay=10, vol=1,
                             invol=2, rd=512, wr=4096, utime_us=300, stime_us=200, majflt=1)
                   for i in range(3)]  # fmt: skip
        for stats in threads:
            kernel.send(exit_message(stats, int.from_bytes(stats[128:132], "little")))
        queued = [
            taskstats(400, 400, ppid=7, last=True, lived_us=5_000 * ms),  # its last task
            taskstats(600, 600, ppid=7, last=False, lived_us=10 * ms),  # a leader
            taskstats(601, 400, last=False, lived_us=2_000 * ms, group_lived_us=5_000 * ms),
        ]  # begun at 8 s: a pass may have read it
        for stats in queued:
            kernel.send(exit_message(stats, int.from_bytes(stats[128:132], "little")))
        taken(listener, 6)
        listener.pass_began()
        clock.now += 1
        kernel.send(exit_message(taskstats(502, 400, last=False, lived_us=10 * ms), 502))
        taken(listener, 7)
        records, folds = listener.take()
    finally:
        listener.close()
        kernel.close()
    assert [r.pid for r in records] == [400, 600, 601, 502]
    assert len(folds) == 1 and listener.folded == 3
    fold = folds[0]
    assert (fold.tgid, fold.ppid, fold.tasks, fold.born) == (400, 7, 3, False)
    assert fold.start_ns == 5 * SEC  # 10 s less the 5 s its process lived
    assert (fold.on_cpu_ns, fold.run_delay_ns, fold.voluntary_switches) == (3003, 30, 3)
    assert (fold.nonvoluntary_switches, fold.read_bytes, fold.write_bytes) == (6, 1536, 12288)
    assert (fold.utime_us, fold.stime_us, fold.major_faults) == (900, 600, 3)
    again, folds_again = listener.take()  # taken once
    assert len(again) == 0 and folds_again == []


def test_a_gather_lasts_toward_a_batch_at_the_rate_records_came_within_its_bounds():
    """The next gather takes about `_BATCH` records at the rate the last ones came: at
    5,000 a second a fifth of a second; at 1,000 a second, no longer than the most (0.4 s:
    the socket's buffer holds a storm that begins meanwhile); at a million a second, no
    shorter than the least; and at most `_RAMP` times the last one."""
    low, high = exits._GATHER_SECONDS
    assert (exits._BATCH, low, high, exits._RAMP) == (1000, 0.002, 0.4, 4)
    assert next_gather(1000, 0.2, last=high) == pytest.approx(0.2)
    assert next_gather(1000, 1.0, last=high) == high
    assert next_gather(200, 0.2, last=high) == high
    assert next_gather(1000, 0.001, last=high) == low
    assert next_gather(1, 30.0, last=low / 4) == low
    assert next_gather(1000, 1.0, last=0.05) == pytest.approx(0.2)


def test_after_a_pass_or_a_quiet_spell_the_gathers_begin_at_the_least_and_grow_fourfold(
    monkeypatch,
):
    """The listener's schedule, each drain scripted (1,000 records every 0.2 s: 5,000 a
    second, toward gathers of 0.2 s): from its start, gathers of 2, 8, 32, 128 ms, then
    0.2 s; a pass that has read every process ends one, and the next is 2 ms again; so
    after a drain that found the socket quiet."""
    listener = ExitListener(sock=Netlink(), family=FAMILY)
    clock = [0.0]
    monkeypatch.setattr(exits, "_monotonic", lambda: clock[0])
    drains = iter([1000] * 6 + [1000] * 2 + [0] + [1000] * 2)
    ends = iter([False] * 5 + [True] + [False] * 10)  # the 6th gather: a pass's read
    gathers: list[float] = []

    def drain() -> int:
        came = next(drains, None)
        if came is None:
            listener._closed.set()
            return 0
        clock[0] += 0.2
        return came

    def gather(seconds: float) -> bool:
        gathers.append(round(seconds, 6))
        return next(ends)

    monkeypatch.setattr(listener, "_drain", drain)
    monkeypatch.setattr(listener, "_gather", gather)
    monkeypatch.setattr(listener, "_wait", lambda: None)
    listener._listen()
    listener._socket.close()
    assert gathers == [0.002, 0.008, 0.032, 0.128, 0.2, 0.2, 0.002, 0.008, 0.002, 0.008]


def _until(done, what: str) -> None:
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_pass_that_read_every_process_ends_a_gather_so_threads_begun_since_fold(
    monkeypatch,
):
    """Mid-gather (of 30 s here, after a record came), the listener looks at the socket as
    soon as a pass has read every process, and then takes each record as it comes: a
    thread begun and gone after that pass is known to have begun after it, and is folded,
    where a record that waited out the gather (since before the pass) would be queued as
    one the pass may have read."""
    monkeypatch.setattr(exits, "_GATHER_SECONDS", (30.0, 30.0))
    kernel = Netlink()
    listener = ExitListener(sock=kernel, family=FAMILY).listen()  # CLOCK_BOOTTIME
    try:
        kernel.send(exit_message(taskstats(500, 400, last=False, lived_us=10_000), 500))
        taken(listener, 1)  # (before any pass: queued) a gather of 30 s begins
        listener.pass_began()
        read_until = listener.clock()
        listener.pass_read(read_until)
        _until(lambda: listener._empty_at > read_until, "the socket looked at after the pass")
        kernel.send(exit_message(taskstats(501, 400, last=False, lived_us=0), 501))
        taken(listener, 2)
        records, folds = listener.take()
    finally:
        listener.close()
        kernel.close()
    assert [record.pid for record in records] == [500]
    assert [(fold.tgid, fold.tasks) for fold in folds] == [(400, 1)]


def test_closing_ends_a_gather_at_once(monkeypatch):
    """A listener closed mid-gather (of 30 s here) stops at once, not when it ends."""
    monkeypatch.setattr(exits, "_GATHER_SECONDS", (30.0, 30.0))
    kernel = Netlink()
    listener = ExitListener(sock=kernel, family=FAMILY).listen()
    try:
        kernel.send(exit_message(taskstats(500, 400, last=False, lived_us=1000), 500))
        taken(listener, 1)  # a gather of 30 s begins
        listener.close()
        listener._thread.join(10)
        assert not listener._thread.is_alive()
    finally:
        kernel.close()


def test_a_record_taken_the_quick_way_is_the_one_parse_stats_reads():
    """The datagram of one record in the kernel's layout is read by two unpacks; any other
    (here: two messages in one datagram) by `parse_messages`: the same record either way."""
    kernel, clock = Netlink(), Clock(10 * SEC)
    listener = ExitListener(clock=clock, sock=kernel, family=FAMILY).listen()
    stats = taskstats(42, 40, ppid=7, last=False, lived_us=1500, group_lived_us=9000,
                      on_cpu=11, delay=22, vol=3, invol=4, rd=512, wr=1024, utime_us=8000,
                      stime_us=4000, majflt=2, comm=b"awk")  # fmt: skip
    try:
        kernel.send(exit_message(stats, 42))
        kernel.send(exit_message(stats, 42) + exit_message(stats, 42))
        taken(listener, 3)
        records, _ = listener.take()
    finally:
        listener.close()
        kernel.close()
    assert list(records) == [parse_stats(stats, 10 * SEC)] * 3


def test_a_last_tasks_message_is_taken_the_quick_way_its_process_sums_left():
    """A multi-threaded process's last task's message carries its AGGR_TGID after the
    task's own record: the quick step takes the record, once, and leaves the sums (its
    tasks' own records again), as `parse_messages` does."""
    stats = taskstats(40, 40, on_cpu=7)
    sums = taskstats(40, 40, on_cpu=12)
    data = bytearray(
        message(
            attribute(
                TASKSTATS_TYPE_AGGR_PID,
                attribute(TASKSTATS_TYPE_PID, struct.pack("=I", 40))
                + attribute(TASKSTATS_TYPE_STATS, stats),
            ),
            attribute(
                TASKSTATS_TYPE_AGGR_TGID,
                attribute(TASKSTATS_TYPE_TGID, struct.pack("=I", 40))
                + attribute(TASKSTATS_TYPE_STATS, sums),
            ),
        )
    )
    kernel = Netlink()
    listener = ExitListener(clock=lambda: 10 * SEC, sock=kernel, family=FAMILY)
    try:
        assert listener._take_one(data, 0, len(data), 10 * SEC, 0)
        records, folds = listener.take()
    finally:
        listener.close()
    assert [(r.pid, r.on_cpu_ns, r.last) for r in records] == [(40, 7, True)] and not folds


def test_a_process_taken_again_under_its_pid_is_another_fold():
    kernel, clock = Netlink(), Clock(10 * SEC)
    listener = ExitListener(clock=clock, sock=kernel, family=FAMILY).listen()
    try:
        listener.pass_read(9 * SEC)
        for group_lived_ms in (500, 200):  # the process 400 begun at 9.5 s, then at 9.8 s
            stats = taskstats(401, 400, last=False, lived_us=100_000,
                              group_lived_us=group_lived_ms * 1000)  # fmt: skip
            kernel.send(exit_message(stats, 401))
        taken(listener, 2)
        _, folds = listener.take()
    finally:
        listener.close()
        kernel.close()
    assert [(f.start_ns, f.tasks, f.born) for f in folds] == [
        (9_500_000_000, 1, True),
        (9_800_000_000, 1, True),
    ]


def test_past_the_bound_a_storms_records_go_first_and_each_loss_is_counted_by_parent(
    monkeypatch,
):
    """Parent 7 fills the queue (its children's records); then 9's and 7's come. Each of
    9's is kept, one of 7's newest dropped for it; each of 7's past the bound is dropped
    itself: 9's tasks lose nothing to the storm beside them."""
    monkeypatch.setattr(exits, "MAX_QUEUED", 5)
    kernel = Netlink()
    listener = ExitListener(clock=lambda: 10 * SEC, sock=kernel, family=FAMILY).listen()
    try:
        for pid in range(100, 105):
            kernel.send(exit_message(taskstats(pid, ppid=7, lived_us=1000), pid))
        for pid in (200, 201, 105, 202):
            ppid = 7 if pid < 200 else 9
            kernel.send(exit_message(taskstats(pid, ppid=ppid, lived_us=1000), pid))
        taken(listener, 9)
        records, _ = listener.take()
        lost = listener.take_lost()
    finally:
        listener.close()
        kernel.close()
    assert sorted(r.pid for r in records) == [100, 101, 200, 201, 202]
    assert lost == Counter({7: 4}) and listener.dropped == 4
    assert listener.take_lost() == Counter()


def test_past_the_bound_the_parent_with_the_most_loses_even_after_it_lost_some(monkeypatch):
    """Parents 100 (a victim's) and 200 (a tenant's) queue 10 records each; then the tenant
    forks from 40 fresh parents, one record each. Each drop falls on whichever parent has
    the most queued at that moment, so 100 and 200 lose alike: never one of them
    emptied while the other keeps all of its own."""
    monkeypatch.setattr(exits, "MAX_QUEUED", 20)
    listener = ExitListener(clock=lambda: 10 * SEC, sock=Netlink(), family=FAMILY)
    for ppid in (100, 200):
        for i in range(10):
            listener._queued(pack_stats(taskstats(1000 + ppid + i, ppid=ppid), 0), ppid)
    for i in range(40):
        listener._queued(pack_stats(taskstats(5000 + i, ppid=3000 + i), 0), 3000 + i)
    records, _ = listener.take()
    kept = Counter(r.ppid for r in records)
    assert len(records) == 20 and listener.dropped == 40
    assert abs(kept[100] - kept[200]) <= 1 and max(kept.values()) <= 2
    listener._socket.close()


def test_a_record_after_a_pad_attribute_is_folded_as_any():
    """Where unaligned access is slow the kernel pads the STATS attribute to 8 bytes
    (`nla_reserve_64bit`: a TASKSTATS_TYPE_NULL attribute before it). Such a message is not
    the layout `_take_one` reads in one unpack; `parse_messages` reads it, and its record
    is folded or queued as the same record unpadded would be."""
    kernel, clock = Netlink(), Clock(10 * SEC)
    listener = ExitListener(clock=clock, sock=kernel, family=FAMILY).listen()
    ms = 1000  # µs
    try:
        listener.pass_read(9 * SEC)
        for pid, last in ((500, False), (400, True)):
            stats = taskstats(pid, 400, ppid=7, last=last, lived_us=10 * ms,
                              group_lived_us=500 * ms, on_cpu=1000)  # fmt: skip
            padded = attribute(
                TASKSTATS_TYPE_AGGR_PID,
                attribute(TASKSTATS_TYPE_PID, struct.pack("=I", pid))
                + attribute(0, b"")  # TASKSTATS_TYPE_NULL, the pad
                + attribute(TASKSTATS_TYPE_STATS, stats),
            )
            kernel.send(message(padded))
        taken(listener, 2)
        records, folds = listener.take()
    finally:
        listener.close()
        kernel.close()
    assert [r.pid for r in records] == [400]  # its process's last task: queued
    assert [(f.tgid, f.tasks, f.on_cpu_ns, f.born) for f in folds] == [(400, 1, 1000, True)]
    assert listener.folded == 1 and not listener.refused

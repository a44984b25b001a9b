"""Many datagrams a call (collector/datagrams.py), on real netlink sockets: the kernel's
answers to generic netlink requests come from its port 0, as exit records do, and need no
privilege to ask for. Each batch holds each datagram whole at its slot, with its size and
sender; a datagram cut to its slot is marked, not taken; and the exit listener reads its
socket so, refusing what is not an exit record."""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import socket
import struct
import time
from collections import Counter

import pytest

from collector import datagrams, exits
from collector.datagrams import Batches, OneByOne
from collector.exits import ExitListener
from tests.exitrecords import FAMILY, Netlink, exit_message, taskstats
from tests.unit.test_tracker import SEC


def _ask(sock: socket.socket, sequence: int) -> None:
    """Ask the kernel for the TASKSTATS family (`CTRL_CMD_GETFAMILY`): one answer each."""
    sock.send(exits.family_request(sequence))


@pytest.fixture
def netlink():
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, exits.NETLINK_GENERIC)
    sock.bind((0, 0))
    yield sock
    sock.close()


def _answered(sock: socket.socket, count: int) -> None:
    """`count` answers asked for, and queued (the kernel answers in the send)."""
    for sequence in range(1, count + 1):
        _ask(sock, sequence)


def test_the_kernels_datagrams_are_read_in_batches_each_whole_at_its_slot(netlink):
    """40 answers, read 16 a call: 16, 16, 8, each at its slot with its own size (its
    netlink header's length), in the order sent, from port 0; then nothing."""
    reader = Batches(netlink, slots=16, slot=1024)
    _answered(netlink, 40)
    got: list[tuple[int, int, int]] = []
    counts = []
    while True:
        try:
            count = reader.receive()
        except BlockingIOError:
            break
        counts.append(count)
        for i in range(count):
            length, _, _, sequence = struct.unpack_from("=IHHI", reader.buffer, i * reader.slot)
            got.append((reader.sizes[i], length, sequence))
            assert reader.ports[i] == 0
    assert counts == [16, 16, 8]
    assert [sequence for _, _, sequence in got] == list(range(1, 41))
    assert all(size == length > 20 for size, length, _ in got)


NETLINK_USERSOCK = 2  # a netlink protocol whose sockets may send each other without privilege


def test_each_datagram_comes_with_its_senders_port_and_one_cut_to_its_slot_is_marked():
    """From another socket (its port id, not the kernel's 0): datagrams of 10, 100 and 20
    bytes read into slots of 32, each whole at its slot but the one cut (-1)."""
    with (
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_USERSOCK) as ours,
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_USERSOCK) as theirs,
    ):
        ours.bind((0, 0))
        theirs.bind((0, 0))
        for data in (b"a" * 10, b"b" * 100, b"c" * 20):
            theirs.sendto(data, (ours.getsockname()[0], 0))
        reader = Batches(ours, slots=4, slot=32)
        assert reader.receive() == 3
        port = theirs.getsockname()[0]
        assert port != 0 and reader.ports[:3] == (port, port, port)
        assert reader.sizes[:3] == (10, -1, 20)
        assert bytes(reader.buffer[:10]) == b"a" * 10
        assert bytes(reader.buffer[64:84]) == b"c" * 20
        with pytest.raises(BlockingIOError):
            reader.receive()


def test_an_empty_socket_and_a_closed_one_say_so(netlink):
    reader = Batches(netlink, slots=4, slot=1024)
    with pytest.raises(BlockingIOError):
        reader.receive()
    other = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, exits.NETLINK_GENERIC)
    closed = Batches(other)
    other.close()
    with pytest.raises(OSError) as raised:
        closed.receive()
    assert raised.value.errno == errno.EBADF


def test_the_buffer_a_kernel_writes_into_cannot_move(netlink):
    reader = Batches(netlink, slots=2, slot=64)
    with pytest.raises(BufferError):
        reader.buffer.extend(b"more")


def test_a_netlink_socket_is_read_in_batches_anything_else_one_by_one(netlink):
    assert isinstance(datagrams.of(netlink), Batches)
    stand_in = Netlink()
    try:
        assert isinstance(datagrams.of(stand_in), OneByOne)
    finally:
        stand_in.close()


class _Sender:
    def __init__(self, sender: object):
        self.sender = sender

    def recvfrom_into(self, buffer: bytearray) -> tuple[int, object]:
        buffer[:3] = b"abc"
        return 3, self.sender


def test_one_by_one_gives_the_senders_port_and_no_port_zero_for_another_address():
    for sender, port in (((0, 0), 0), ((4242, 0), 4242), ("", -1), (None, -1), ((0,), -1)):
        reader = OneByOne(_Sender(sender))
        assert reader.receive() == 1
        assert (reader.sizes, reader.ports, bytes(reader.buffer[:3])) == ((3,), (port,), b"abc")


def test_the_listener_reads_a_real_socket_in_batches_and_refuses_what_is_no_exit(netlink):
    """The kernel's answers on the listener's own netlink socket are read in batches and
    refused, each counted: of another family (`not_taskstats`), or cut to its slot
    (`malformed`); listening goes on."""
    family = 0x7FFF  # no family the kernel has: every answer is of another
    listener = ExitListener(clock=time.monotonic_ns, sock=netlink, family=family)
    assert isinstance(listener._reader, Batches)
    cut = Batches(netlink, slots=4, slot=32)
    try:
        listener.listen()
        _answered(netlink, 30)
        deadline = time.monotonic() + 5
        while listener.refused["not_taskstats"] < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.refused == Counter(not_taskstats=30)
        assert listener._thread.is_alive()
        with listener._lock:  # the listener's thread waits; a batch cut to its slots
            listener._reader = cut
            _answered(netlink, 3)
        deadline = time.monotonic() + 5
        while listener.refused["malformed"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.refused == Counter(not_taskstats=30, malformed=3)
        assert listener.received == 0
    finally:
        listener.close()


class Scripted:
    """A reader with `datagrams.Batches`' interface whose calls give what a test set: a
    batch of (datagram, sender's port) at slots of `slot` bytes (None: one cut to its
    slot), or an error to raise; then BlockingIOError. The slots past a batch hold stale
    sizes and ports, as the real one's do."""

    slot = 1024

    def __init__(self, *calls):
        self.calls = list(calls)
        self.buffer = bytearray(8 * self.slot)
        self.sizes = self.ports = ()

    def receive(self) -> int:
        if not self.calls:
            raise BlockingIOError(errno.EAGAIN, "empty")
        call = self.calls.pop(0)
        if isinstance(call, OSError):
            raise call
        sizes = []
        for i, (data, _) in enumerate(call):
            if data is not None:
                self.buffer[i * self.slot : i * self.slot + len(data)] = data
            sizes.append(-1 if data is None else len(data))
        stale = 8 - len(call)
        self.sizes = (*sizes, *(len(exit_message(taskstats(9), 9)),) * stale)
        self.ports = (*(port for _, port in call), *(0,) * stale)
        return len(call)


def test_the_listener_takes_each_slot_of_every_batch_until_the_socket_is_empty():
    """Records at every slot of a batch are taken from their slot; another port's and a cut
    one refused. A batch cut short by an overrun (ENOBUFS, reported by the next read) does
    not say the socket was found empty: reading goes on, and the records after it are
    stamped as having waited since the socket was last found empty, not since the short
    batch."""
    ticks = itertools.count(10 * SEC, 1_000_000)
    listener = ExitListener(clock=lambda: next(ticks), sock=Netlink(), family=FAMILY)
    ms = 1000  # µs

    def thread(pid: int) -> bytes:
        stats = taskstats(pid, 400, ppid=7, last=False, lived_us=10 * ms,
                          group_lived_us=5_000 * ms, on_cpu=100)  # fmt: skip
        return exit_message(stats, pid)

    def last(pid: int, comm: bytes) -> bytes:
        return exit_message(taskstats(pid, pid, ppid=7, lived_us=10 * ms, comm=comm), pid)

    hour = taskstats(700, 700, lived_us=10 * ms, on_cpu=3600 * SEC)
    old = exit_message(taskstats(610, version=11, lived_us=10 * ms, comm=b"old"), 610)
    listener._reader = Scripted(
        [(thread(501), 0), (exit_message(hour, 700), 4242), (None, 0), (last(600, b"awk"), 0)],
        [(thread(504), 0), (old, 0)],  # a record the take step leaves to `parse_messages`
        [(thread(502), 0)],
        OSError(errno.ENOBUFS, "No buffer space available"),
        [(last(601, b"cc1"), 0), (thread(503), 0)],
    )
    try:
        listener.pass_read(9 * SEC)
        empty_at = listener._empty_at
        assert listener._drain() == 7
        records, folds = listener.take()
    finally:
        listener.close()
    # (queued by parent: 600's and 601's, then 610's)
    assert [(r.pid, r.comm) for r in records] == [(600, "awk"), (601, "cc1"), (610, "old")]
    assert [(f.tgid, f.tasks, f.on_cpu_ns) for f in folds] == [(400, 4, 400)]
    assert listener.refused == Counter(not_kernel=1, malformed=1)
    assert listener.overflows == 1 and listener.received == 7
    assert all(r.waited_ns == r.received_ns - empty_at for r in records)
    assert listener._empty_at == records[1].received_ns  # taken before the read found it empty


def test_a_datagram_cut_to_its_slot_is_refused_and_the_slots_grow_from_then_on(netlink, caplog):
    """Datagrams longer than the listener's slots (a kernel whose messages outgrew them)
    come cut: each is refused as malformed, and the listener says so and reads with slots
    twice as large from then on, until they fit (here the kernel's answers to
    `CTRL_CMD_GETFAMILY`, of a family not the listener's: refused as such once whole)."""
    netlink.setblocking(False)
    _ask(netlink, 1)
    size = len(netlink.recv(65536))  # an answer's size
    listener = ExitListener(clock=time.monotonic_ns, sock=netlink, family=0x7FFF)
    listener._reader = Batches(netlink, slots=4, slot=64)
    slots: list[int] = []
    with caplog.at_level(logging.WARNING, logger="collector.exits"):
        for _ in range(10):
            if listener._reader.slot >= size:
                break
            slots.append(listener._reader.slot)
            _answered(netlink, 2)
            listener._drain()
        _answered(netlink, 2)
        listener._drain()
    assert size > 64 and slots == [64 << k for k in range(len(slots))]
    assert listener._reader.slot == 64 << len(slots) >= size
    assert listener.refused == Counter(malformed=2 * len(slots), not_taskstats=2)
    said = [record for record in caplog.records if "was cut" in record.getMessage()]
    assert len(said) == len(slots)


def _refusing(code: int, then=None):
    """A `recvmmsg` that fails with `code`, then (given `then`) calls `then` from there on."""
    calls = []

    def recvmmsg(*args):
        calls.append(args)
        if then is not None and len(calls) > 1:
            return then(*args)
        ctypes.set_errno(code)
        return -1

    return recvmmsg


def test_a_refused_recvmmsg_falls_back_to_a_datagram_a_call(netlink, monkeypatch, caplog):
    """Where a seccomp profile refuses `recvmmsg` (EPERM), the listener reads a datagram a
    call from then on, without waiting on its socket, and says so once; an interrupted call
    (EINTR) is made again."""
    netlink.setblocking(False)
    family = 0x7FFF  # no family the kernel has: every answer is refused, counted
    listener = ExitListener(clock=time.monotonic_ns, sock=netlink, family=family)
    monkeypatch.setattr(datagrams, "_RECVMMSG", _refusing(errno.EPERM))
    _answered(netlink, 3)
    assert listener._drain() == 3
    assert isinstance(listener._reader, OneByOne)
    assert listener.refused == Counter(not_taskstats=3)
    assert "recvmmsg refused" in caplog.text
    blocking = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, exits.NETLINK_GENERIC)
    try:
        blocking.bind((0, 0))
        with pytest.raises(BlockingIOError):  # a real socket is not waited on
            OneByOne(blocking).receive()
    finally:
        blocking.close()
    listener.close()


def test_an_interrupted_recvmmsg_is_made_again(netlink, monkeypatch):
    real = datagrams._RECVMMSG
    monkeypatch.setattr(datagrams, "_RECVMMSG", _refusing(errno.EINTR, then=real))
    reader = Batches(netlink, slots=4, slot=1024)
    _answered(netlink, 2)
    assert reader.receive() == 2

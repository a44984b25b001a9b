"""Many datagrams a call (collector/datagrams.py), on real netlink sockets: the kernel's
answers to generic netlink requests come from its port 0, as exit records do, and need no
privilege to ask for. Each batch holds each datagram whole at its slot, with its size and
sender; a datagram cut to its slot is marked, not taken; and the exit listener reads its
socket so, refusing what is not an exit record."""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections import Counter

import pytest

from collector import datagrams, exits
from collector.datagrams import Batches, OneByOne
from collector.exits import ExitListener
from tests.exitrecords import Netlink


def _ask(sock: socket.socket, sequence: int) -> None:
    """Ask the kernel for the TASKSTATS family (`CTRL_CMD_GETFAMILY`): one answer each."""
    name = exits._attribute(exits.CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
    sock.send(exits._request(exits.GENL_ID_CTRL, exits.CTRL_CMD_GETFAMILY, name, sequence))


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
    """40 answers, read 16 a call: 16, 16, 8 (fewer than a batch: the socket was found
    empty), each at its slot with its own size (its netlink header's length), in the order
    sent, from port 0; then nothing."""
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


def test_a_datagram_longer_than_its_slot_is_marked_not_taken(netlink):
    reader = Batches(netlink, slots=4, slot=32)
    _answered(netlink, 2)
    assert reader.receive() == 2
    assert reader.sizes[:2] == (-1, -1)


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

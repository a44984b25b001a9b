"""Many datagrams a call: `recvmmsg(2)` on a netlink socket, for the exit records'
listener (collector/exits.py, `ExitListener._drain`).

Python's `socket` reads one datagram a call (`recvfrom_into`): at a build farm's exit rate,
a system call a record, and on a VM under the kernel's mitigations the interpreter's next
steps after each call are slower too. The listener's thread spent ~5 µs a record so at
1,000 exits a second, ~4.1-4.5 reading in batches (docs/performance.md, "Exit records");
most of what is left of a read is the kernel's own (the message copied, its buffer freed).
`recvmmsg` is libc's (glibc since 2.12, musl), called through `ctypes`, no code of ours
compiled: up to `slots` datagrams into one buffer, each in a slot of its own, with each
one's size, sender and flags.

`of(sock)` gives the reader a socket is read with: `Batches` for a netlink
socket where libc has `recvmmsg`, else `OneByOne` (`recvfrom_into`, the same interface), as
for the tests' stand-in sockets. Both hold what the last `receive()` read in `buffer`:
datagram `i` at `i * slot`, `sizes[i]` bytes (-1 where it was cut to its slot,
`MSG_TRUNC`: no exit message the kernel sends is near the default slot), sent from port
`ports[i]` (the kernel's is 0).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from typing import Any, Protocol

MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20
SLOTS = 256
"""Datagrams a call at most: a batch the listener gathers (`_BATCH`, 1,000) in four calls."""
SLOT_BYTES = 2048
"""Bytes for each datagram: an exit message of a process's last task carries two records
where the process had threads (its own and its process's sums: 1,172 bytes on Linux 6.18,
`struct taskstats` version 16, where a thread's message is 596); the struct grows only at
its end, by a few words a version. A message cut to its slot is refused and counted, never
taken, and the listener reads with slots twice as large from then on (`MAX_SLOT_BYTES`).
The buffer: 512 KiB, half the pages slots of 4 KB touched (a record took ~0.1-0.2 µs
longer so: docs/performance.md, "Exit records")."""
MAX_SLOT_BYTES = 8192
"""The most a slot grows to where datagrams come cut (`ExitListener._wider`): 2 MiB in all."""
_NAME_BYTES = 12  # struct sockaddr_nl: family, pad, port id (nl_pid), groups


class DatagramReader(Protocol):
    """What `ExitListener._drain` reads the socket with: `Batches` or `OneByOne`."""

    buffer: bytearray
    slot: int
    sizes: tuple[int, ...]  # of the datagrams the last `receive()` read, at their slots
    ports: tuple[int, ...]  # (past the count it returned: stale)

    def receive(self) -> int:
        """Read what the socket holds, up to a batch: how many datagrams (at least one);
        BlockingIOError (or TimeoutError) where it holds none; OSError as the read's. A
        batch smaller than a full one does not say the socket was found empty: the
        kernel's `recvmmsg` also ends a batch early at an error (a netlink overrun's
        ENOBUFS), which the next call reports; only BlockingIOError says so."""
        ...


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("length", ctypes.c_uint)]


def _recvmmsg():
    """libc's `recvmmsg`, or None where it has none (or ctypes finds no libc)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).recvmmsg
    except (AttributeError, OSError):
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    function.restype = ctypes.c_int
    return function


_RECVMMSG = _recvmmsg()


class Batches:
    """`recvmmsg` into `slots` slots of `slot` bytes each (see the module's docstring). The
    memory is Python's (bytearrays, their addresses handed to the kernel once, and pinned:
    a bytearray exported to ctypes cannot be resized, so never moves): `buffer` is read
    with `struct.unpack_from` as any bytearray. Of what the kernel writes back into the
    headers, each message's size and flags are read; its `msg_namelen` comes back as the
    12 bytes of a `sockaddr_nl` on a netlink socket, and nothing else it writes is used
    again, so nothing is reset between calls."""

    def __init__(self, sock: socket.socket, slots: int = SLOTS, slot: int = SLOT_BYTES):
        if _RECVMMSG is None:
            raise OSError(errno.ENOSYS, "libc has no recvmmsg")
        # the descriptor is asked of the socket at each call: -1 once it is closed (EBADF);
        # the listener closes it only under the lock its reads are made under
        self._socket = sock
        self.slot, self._slots = slot, slots
        self.buffer = bytearray(slots * slot)
        self._names = bytearray(slots * _NAME_BYTES)
        self._iovecs = (_IOVec * slots)()
        self._headers = (_MMsgHdr * slots)()
        self._pins = (
            (ctypes.c_char * len(self.buffer)).from_buffer(self.buffer),
            (ctypes.c_char * len(self._names)).from_buffer(self._names),
        )
        base, names = (ctypes.addressof(pin) for pin in self._pins)
        for i in range(slots):
            self._iovecs[i].base, self._iovecs[i].length = base + i * slot, slot
            header = self._headers[i].hdr
            header.name, header.namelen = names + i * _NAME_BYTES, _NAME_BYTES
            header.iov, header.iovlen = ctypes.addressof(self._iovecs[i]), 1
        stride = ctypes.sizeof(_MMsgHdr)
        flags_at = _MMsgHdr.hdr.offset + _MsgHdr.flags.offset
        length_at = _MMsgHdr.length.offset
        # each datagram's size and flags, in two unpacks over every slot's header
        self._sizes = struct.Struct("=" + f"{length_at}xI{stride - length_at - 4}x" * slots)
        self._flags = struct.Struct("=" + f"{flags_at}xi{stride - flags_at - 4}x" * slots)
        self._ports = struct.Struct("=" + "4xI4x" * slots)  # sockaddr_nl's nl_pid
        self._view = memoryview(self._headers).cast("B")
        self.sizes: tuple[int, ...] = ()
        self.ports: tuple[int, ...] = ()

    def receive(self) -> int:
        while True:
            got = _RECVMMSG(self._socket.fileno(), self._headers, self._slots, MSG_DONTWAIT, None)
            if got > 0:
                break
            code = ctypes.get_errno() if got < 0 else errno.EAGAIN
            if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise BlockingIOError(code, os.strerror(code))
            if code != errno.EINTR:  # (retried, as Python's own socket calls are: PEP 475)
                raise OSError(code, os.strerror(code))
        sizes = self._sizes.unpack_from(self._view)
        flags = self._flags.unpack_from(self._view)
        if any(flag & MSG_TRUNC for flag in flags[:got]):  # cut to the slot: not taken
            sizes = tuple(
                -1 if flag & MSG_TRUNC else size for flag, size in zip(flags, sizes, strict=True)
            )
        self.sizes, self.ports = sizes, self._ports.unpack_from(self._names)
        return got


class _Socket(Protocol):
    def recvfrom_into(
        self, buffer: bytearray, nbytes: int = ..., flags: int = ...
    ) -> tuple[int, Any]: ...


class OneByOne:
    """`recvfrom_into`, a datagram a call: for a socket `Batches` cannot read (a test's
    stand-in; a libc without `recvmmsg`, or a seccomp profile that refuses it). A real
    socket is read without waiting (`MSG_DONTWAIT`), as `Batches` reads it, whatever its
    timeout."""

    def __init__(self, sock: _Socket, slot: int = 1 << 20):
        self._socket = sock
        self._dontwait = isinstance(sock, socket.socket)
        self.slot = slot
        self.buffer = bytearray(slot)
        self.sizes: tuple[int, ...] = ()
        self.ports: tuple[int, ...] = ()

    def receive(self) -> int:
        if self._dontwait:
            size, sender = self._socket.recvfrom_into(self.buffer, 0, MSG_DONTWAIT)
        else:
            size, sender = self._socket.recvfrom_into(self.buffer)
        # (port id, groups); anything else is no kernel's (`exits.from_kernel`)
        port = sender[0] if isinstance(sender, tuple) and len(sender) == 2 else -1
        self.sizes, self.ports = (size,), (port,)
        return 1


def of(sock: object) -> DatagramReader:
    """The reader `sock` is read with: in batches where it is a netlink socket and libc
    has `recvmmsg`, else one datagram a call."""
    if (
        _RECVMMSG is not None
        and isinstance(sock, socket.socket)
        and sock.family == socket.AF_NETLINK
    ):
        return Batches(sock)
    return OneByOne(sock)  # type: ignore[arg-type]

"""TLS for the listener, over memory buffers: the event loop moves the bytes, a session
turns them into plaintext and back (the standard library's `ssl`: an `SSLObject` on two
`MemoryBIO`s), so that the handshake is one more step of reading a request, under the
same deadline, and never holds a thread.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Protocol

_READ = 64 * 1024


class Failed(Exception):
    """The handshake or a record failed: the connection is to be dropped."""


class Closed(Exception):
    """The client closed the TLS session (close_notify)."""


class Session(Protocol):
    def receive(self, data: bytes) -> bytes:
        """Ciphertext in, the plaintext it completes out (b"" during the handshake)."""

    def send(self, data: bytes) -> bytes:
        """Plaintext in, the ciphertext to write out (with anything pending before it)."""

    def pending(self) -> bytes:
        """Ciphertext waiting to be written (handshake messages, alerts)."""

    def close(self) -> bytes:
        """The close_notify alert to write, if the session can still send one."""


class Server(Protocol):
    def session(self) -> Session: ...


class StdlibServer:
    def __init__(self, context: ssl.SSLContext):
        self.context = context

    def session(self) -> StdlibSession:
        return StdlibSession(self.context)


class StdlibSession:
    __slots__ = ("_in", "_out", "_ready", "_ssl")

    def __init__(self, context: ssl.SSLContext):
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=True)
        self._ready = False

    def receive(self, data: bytes) -> bytes:
        self._in.write(data)
        try:
            if not self._ready:
                try:
                    self._ssl.do_handshake()
                except ssl.SSLWantReadError:
                    return b""
                self._ready = True
            chunks = []
            while True:
                try:
                    chunk = self._ssl.read(_READ)
                except ssl.SSLWantReadError:
                    break
                if not chunk:
                    raise Closed
                chunks.append(chunk)
            return b"".join(chunks)
        except ssl.SSLZeroReturnError:
            raise Closed from None
        except ssl.SSLError as error:
            raise Failed(error.reason or str(error)) from None

    def send(self, data: bytes) -> bytes:
        try:
            self._ssl.write(data)
        except ssl.SSLError as error:
            raise Failed(error.reason or str(error)) from None
        return self._out.read()

    def pending(self) -> bytes:
        return self._out.read()

    def close(self) -> bytes:
        if self._ready:
            with contextlib.suppress(ssl.SSLError):
                self._ssl.unwrap()
        return self._out.read()

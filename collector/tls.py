"""TLS for the listener, over memory buffers: the event loop moves the bytes, a session
turns them into plaintext and back. Two engines, one interface:

- the standard library's `ssl` (an `SSLObject` on two `MemoryBIO`s) for every client
  certificate mode that verifies what it gets: `NoClientCert`, `VerifyClientCertIfGiven`,
  `RequireAndVerifyClientCert`;
- pyOpenSSL for the two modes that ask for a certificate and do not verify it
  (`RequestClientCert`, `RequireAnyClientCert`): Go's meaning, which exporter-toolkit
  passes on unchanged, and which `ssl` cannot express (it verifies every certificate it
  asks for against a CA, and has no verification callback).
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

    @property
    def verified(self) -> bool:
        """Whether the handshake verified a client certificate against the server's CAs."""


class Server(Protocol):
    terms: bytes
    """What a client is asked for and verified by (`collector.webconfig`): a connection
    made under other terms is closed once idle."""

    def session(self) -> Session: ...


class StdlibServer:
    def __init__(self, context: ssl.SSLContext, terms: bytes = b""):
        self.context = context
        self.terms = terms

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

    @property
    def verified(self) -> bool:
        # a certificate is there only where the context verified it (CERT_OPTIONAL,
        # CERT_REQUIRED); with CERT_NONE none is asked for and the dict is empty
        return self._ready and bool(self._ssl.getpeercert())


class UnverifiedServer:
    """Asks every client for a certificate and accepts any it gets, verified or not; with
    `required`, a client without one fails the handshake (Go's `RequireAnyClientCert`),
    without, it is let in too (`RequestClientCert`)."""

    def __init__(
        self,
        context: ssl.SSLContext,
        cert_file: str,
        key_file: str,
        required: bool,
        terms: bytes = b"",
    ):
        from OpenSSL import SSL

        self.terms = terms
        self._SSL = SSL
        ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
        versions = _openssl_versions(SSL)
        ctx.set_min_proto_version(versions[context.minimum_version])
        if context.maximum_version in versions:
            ctx.set_max_proto_version(versions[context.maximum_version])
        ctx.use_certificate_chain_file(cert_file)
        ctx.use_privatekey_file(key_file)
        ctx.check_privatekey()
        mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if required else 0)
        ctx.set_verify(mode, lambda connection, certificate, error, depth, ok: True)
        ctx.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_NO_RENEGOTIATION)
        self.context = ctx

    def session(self) -> OpenSSLSession:
        return OpenSSLSession(self._SSL, self.context)


def _openssl_versions(SSL) -> dict:
    return {
        ssl.TLSVersion.TLSv1: SSL.TLS1_VERSION,
        ssl.TLSVersion.TLSv1_1: SSL.TLS1_1_VERSION,
        ssl.TLSVersion.TLSv1_2: SSL.TLS1_2_VERSION,
        ssl.TLSVersion.TLSv1_3: SSL.TLS1_3_VERSION,
    }


class OpenSSLSession:
    __slots__ = ("_SSL", "_conn", "_ready")

    def __init__(self, SSL, context):
        self._SSL = SSL
        self._conn = SSL.Connection(context, None)
        self._conn.set_accept_state()
        self._ready = False

    def receive(self, data: bytes) -> bytes:
        SSL = self._SSL
        self._conn.bio_write(data)
        try:
            if not self._ready:
                try:
                    self._conn.do_handshake()
                except SSL.WantReadError:
                    return b""
                self._ready = True
            chunks = []
            while True:
                try:
                    chunks.append(self._conn.recv(_READ))
                except SSL.WantReadError:
                    break
            return b"".join(chunks)
        except SSL.ZeroReturnError:
            raise Closed from None
        except SSL.Error as error:
            raise Failed(str(error)) from None

    def send(self, data: bytes) -> bytes:
        try:
            view = memoryview(data)
            while view:
                view = view[self._conn.send(view) :]
        except self._SSL.Error as error:
            raise Failed(str(error)) from None
        return self.pending()

    def pending(self) -> bytes:
        chunks = []
        while True:
            try:
                chunks.append(self._conn.bio_read(_READ))
            except self._SSL.WantReadError:
                return b"".join(chunks)

    def close(self) -> bytes:
        if self._ready:
            with contextlib.suppress(self._SSL.Error):
                self._conn.shutdown()
        return self.pending()

    @property
    def verified(self) -> bool:
        return False  # any certificate is taken: none is verified

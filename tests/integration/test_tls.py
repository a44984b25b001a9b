"""The listener's TLS sessions, of both engines (`ssl` for the modes that verify what
they get, pyOpenSSL for RequestClientCert and RequireAnyClientCert), as a client sees
them on the wire: a clean end, pipelined requests, an answer of many records."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector import tls, webconfig
from collector.passloop import PassLoop
from tests.integration.test_serve import CountingEngine, serving
from tests.webconfigs import client_context, write_config

ENGINES = ["NoClientCert", "RequestClientCert"]  # `ssl`'s, pyOpenSSL's


@contextlib.contextmanager
def tls_serving(pki: Path, tmp_path: Path, mode: str, groups: int = 1) -> Iterator[int]:
    text = (f"tls_server_config:\n  cert_file: {pki}/server.crt\n"
            f"  key_file: {pki}/server.key\n  client_auth_type: {mode}\n")  # fmt: skip
    config = write_config(tmp_path, text)
    loop = PassLoop(CountingEngine(groups=groups), interval=60)
    loop.run_pass()
    loop.run_pass()
    with serving(loop, web=webconfig.load(str(config))) as port:
        yield port


@contextlib.contextmanager
def connected(pki: Path, port: int) -> Iterator[ssl.SSLSocket]:
    """A TLS connection that tells a clean end (close_notify) from a cut one (an error)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    context = client_context(pki, True)
    with context.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False) as s:
        yield s


def read_to_the_end(connection: ssl.SSLSocket) -> bytes:
    chunks = []
    while chunk := connection.recv(65536):  # SSLEOFError where the end is not clean
        chunks.append(chunk)
    return b"".join(chunks)


GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.mark.parametrize("mode", ENGINES)
def test_the_server_ends_a_tls_connection_with_close_notify(pki, tmp_path, mode):
    """`Connection: close` answered, then the end of the TLS session said (close_notify)
    before the TCP connection closes: the client can tell the answer is whole."""
    with tls_serving(pki, tmp_path, mode) as port, connected(pki, port) as connection:
        connection.sendall(GET + b"Connection: close\r\n\r\n")
        answer = read_to_the_end(connection)
    assert answer.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("mode", ENGINES)
def test_a_clients_close_notify_is_answered_with_one(pki, tmp_path, mode):
    with tls_serving(pki, tmp_path, mode) as port, connected(pki, port) as connection:
        connection.sendall(GET + b"\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += connection.recv(65536)
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += connection.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 ")
        connection.settimeout(10)
        connection.unwrap().close()  # returns once the server's close_notify came


@pytest.mark.parametrize("mode", ENGINES)
def test_pipelined_requests_over_many_tls_records_are_each_answered(pki, tmp_path, mode):
    """Requests sent at once, 48 KiB of them (three or more TLS records, read at once by
    the server), are each answered, in order."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 60 + b"\r\n\r\n"
    count = 48 * 1024 // len(request)
    with tls_serving(pki, tmp_path, mode) as port, connected(pki, port) as connection:
        connection.sendall(request * (count - 1) + request[:-2] + b"Connection: close\r\n\r\n")
        answer = read_to_the_end(connection)
    assert answer.count(b"HTTP/1.1 200 ") == count
    assert b"HTTP/1.1 400" not in answer


@pytest.mark.parametrize("mode", ENGINES)
def test_an_answer_of_many_tls_records_reaches_the_client_whole(pki, tmp_path, mode):
    """A /metrics page of hundreds of KiB (many TLS records, more than one read of the
    session's output) reaches the client byte for byte."""
    with tls_serving(pki, tmp_path, mode, groups=2000) as port:
        plain = []
        for _ in range(2):
            with connected(pki, port) as connection:
                connection.sendall(GET + b"Connection: close\r\n\r\n")
                plain.append(read_to_the_end(connection))
    head, _, body = plain[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert len(body) > 256 * 1024
    assert plain[0] == plain[1]
    length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    assert length and int(length[0].split(b":")[1]) == len(body)
    assert body.endswith(b"\n") and b"XXXX" not in body


# what OpenSSL says of plain HTTP sent to the TLS port: `ssl`'s reason code, pyOpenSSL's list
FAILED_HANDSHAKE = [
    ("NoClientCert", "HTTP_REQUEST"),
    ("RequestClientCert", "[('SSL routines', '', 'http request')]"),
]


@pytest.mark.parametrize(("mode", "said"), FAILED_HANDSHAKE)
def test_a_failed_handshake_is_logged_in_openssls_words(pki, tmp_path, caplog, mode, said):
    """Plain HTTP to the TLS port: the connection is dropped, and the debug log says why
    as OpenSSL said it."""
    caplog.set_level("DEBUG", logger="collector.listener")
    with (
        tls_serving(pki, tmp_path, mode) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as plain,
    ):
        plain.sendall(GET + b"\r\n")
        with contextlib.suppress(ConnectionResetError):
            plain.recv(65536)
    (line,) = [r.getMessage() for r in caplog.records if "TLS with" in r.getMessage()]
    assert line == f"TLS with 127.0.0.1 failed: {said}"


# -- sessions in memory: what a session says when it fails, whichever call meets it -------


def server_session(pki: Path, engine: str) -> tls.Session:
    """A session of the engine the listener serves `engine` (a client_auth_type) with."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    if engine == "NoClientCert":
        return tls.StdlibServer(context).session()
    cert, key = str(pki / "server.crt"), str(pki / "server.key")
    return tls.UnverifiedServer(context, cert, key, required=False).session()


def handshaken(pki: Path, session: tls.Session) -> tuple[ssl.SSLObject, ssl.MemoryBIO]:
    """A client's end of `session`, the handshake done: its object and its output."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context(pki, True).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    for _ in range(10):
        try:
            client.do_handshake()
            break
        except ssl.SSLWantReadError:
            session.receive(outgoing.read())
            incoming.write(session.pending())
    else:
        raise AssertionError("no handshake")
    return client, outgoing


def in_openssls_words(failed: tls.Failed, engine: str) -> str:
    """What the listener logs of a failure: `ssl`'s reason code, else its text; pyOpenSSL's
    error list."""
    cause = failed.__context__
    assert cause is not None
    if engine == "NoClientCert":
        return getattr(cause, "reason", None) or str(cause)
    return str(cause)


@pytest.mark.parametrize("mode", ENGINES)
def test_a_failed_session_tells_each_later_failure_in_openssls_words(pki, mode):
    """After a failed handshake (plain HTTP), a further read and a write fail too, each
    told as OpenSSL tells it — for `ssl`, an end of file or I/O error that has no reason
    code, so its text — never as None."""
    session = server_session(pki, mode)
    with pytest.raises(tls.Failed):
        session.receive(GET + b"\r\n")
    with pytest.raises(tls.Failed) as read:
        session.receive(b"more of it")
    with pytest.raises(tls.Failed) as write:
        session.send(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    for failed in (read.value, write.value):
        said = in_openssls_words(failed, mode)
        assert failed.args == (said,) and said not in ("", "None")
    if mode == "NoClientCert":  # none of the two has a reason code: its text is told
        assert read.value.__context__.reason is None and write.value.__context__.reason is None


@pytest.mark.parametrize("mode", ENGINES)
def test_closing_a_session_whose_record_failed_raises_nothing(pki, mode):
    """A record that fails to decrypt after the handshake ends the session; closing it then
    (OpenSSL refuses the shutdown) raises nothing: there is no close_notify to send."""
    session = server_session(pki, mode)
    client, outgoing = handshaken(pki, session)
    client.write(b"GET / HTTP/1.1\r\n")
    record = outgoing.read()
    with pytest.raises(tls.Failed) as failed:
        session.receive(record[:-1] + bytes([record[-1] ^ 1]))
    assert "bad record mac" in str(failed.value).lower().replace("_", " ")
    assert isinstance(session.close(), bytes)

"""`procdelta top --from`: bad input in one line, and the client of a serve's `/processes`
(refusals, the shape checked, TLS, credentials, redirects, deadlines, size caps)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import locale
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import collector
from collector import top
from collector.exporter import make_server
from collector.passloop import PassLoop
from tests.integration.test_cli import assert_one_line_error, procdelta
from tests.integration.test_serve import CountingEngine, serving
from tests.net import free_port

# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--pod", "just-a-name"], ["--pod", "NAMESPACE/NAME"]),
        (["--pod", "a/b/c"], ["--pod", "NAMESPACE/NAME"]),
        (["--pod", "/b"], ["--pod"]),
        (["--cgroup", "relative/path"], ["--cgroup"]),
        (["--pod", "a/b", "--cgroup", "/x"], ["--pod", "--cgroup"]),
        (["--threads"], ["--threads", "--pod", "--cgroup"]),
        (["--sort", "comm"], ["--sort", "comm"]),
        (["--limit", "-1"], ["--limit"]),
        (["--interval", "0"], ["--interval"]),
        (["--format", "prometheus"], ["--format"]),
        (["--from", "ftp://example.invalid"], ["--from", "http://"]),
        (["--from", "127.0.0.1:port"], ["--from", "http://"]),
        (["--from", "http://[::1"], ["--from", "http://"]),
        (["--from", "http://127.0.0.1:1", "--from.key-file", "k"], ["--from.cert-file"]),
        (["--from", "http://127.0.0.1:1", "--from.password-file", "p"], ["--from.username"]),
    ],
)
def test_bad_input_is_one_clear_line(args, words):
    assert_one_line_error(procdelta("top", "--format", "json", *args), *words)


def test_a_bad_value_from_the_environment_names_its_variable():
    result = procdelta("top", "--format", "json", env={"PROCDELTA_POD": "nope"})
    assert_one_line_error(result, "PROCDELTA_POD (for --pod)", "NAMESPACE/NAME")


def test_an_unreachable_server_is_one_line():
    port = free_port()  # nothing listens there
    result = procdelta("top", "--from", f"127.0.0.1:{port}", "--format", "json")
    assert_one_line_error(result, f"--from http://127.0.0.1:{port}", "cannot connect", status=1)


@contextlib.contextmanager
def hostile(answer, read_head: bool = True) -> Iterator[tuple[int, list[bytes]]]:
    """A server on 127.0.0.1 that reads each request's head (unless not `read_head`: a
    TLS client's hello has none), records it and hands the socket to `answer(sock,
    port)`; (its port, the heads it read)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    heads: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                return
            with sock:
                head = b""
                while read_head and b"\r\n\r\n" not in head and (chunk := sock.recv(4096)):
                    head += chunk
                heads.append(head)
                with contextlib.suppress(OSError):
                    answer(sock, port)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, heads
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        server.close()
        thread.join(10)


def top_from(port: int, *args: str) -> subprocess.CompletedProcess:
    return procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json", *args)


def fetched(port: int, scheme: str = "http", **remote) -> str:
    """The one line a RemoteFeed's fetch from 127.0.0.1:`port` fails with."""
    source = top.RemoteFeed(top.Remote(f"{scheme}://127.0.0.1:{port}", **remote), top.Selection())
    with pytest.raises(top.TopError) as raised:
        source.fetch()
    return str(raised.value)


def answering(status: bytes, body: bytes = b""):
    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body)

    return answer


def test_an_answer_over_the_cap_is_refused_in_process(monkeypatch):
    monkeypatch.setattr(top.remote, "MAX_ANSWER_BYTES", 1 << 20)
    body = b'{"processes": []}'.ljust((1 << 20) + 1)
    with hostile(answering(b"200 OK", body)) as (port, _):
        assert fetched(port).endswith(": an answer over 1 MiB is no procdelta /processes answer")
    with hostile(answering(b"200 OK", body[: 1 << 20])) as (port, _):  # at the cap: taken
        source = top.RemoteFeed(top.Remote(f"http://127.0.0.1:{port}"), top.Selection())
        assert source.fetch().document == {"processes": [], "groups": []}


@pytest.mark.parametrize(
    ("status", "body", "remote", "said"),
    [
        (b"401 Unauthorized", b"", {}, "401 Unauthorized: the server wants basic auth; give "
         "--from.username and --from.password-file"),
        (b"401 Unauthorized", b"", {"username": "bob"}, "401 Unauthorized: the server refused "
         "user 'bob' (check --from.username and --from.password-file)"),
        (b"404 Not Found", b"", {}, "404 Not Found: no /processes there (a procdelta serve "
         "started with --no-web.processes, or not procdelta; --from takes the server's base URL)"),
        (b"301 Moved", b"", {}, "301: the server redirects, which procdelta serve never does; "
         "not followed (--from takes the server's own base URL)"),
        (b"399 Odd", b"", {}, "399: the server redirects, which procdelta serve never does; "
         "not followed (--from takes the server's own base URL)"),
        (b"400 Odd", b"\n", {}, "400 Odd"),
        (b"503 Busy", b"too many\x1b[2J\nsecond line", {}, "503 too many?[2J"),
        (b"500 Oops", b"x" * 300, {}, "500 " + "x" * 200),
    ],
)  # fmt: skip
def test_a_refusal_is_said_in_one_line_of_what_to_do(status, body, remote, said):
    with hostile(answering(status, body)) as (port, _):
        line = fetched(port, **remote)
    assert line.startswith(f"--from http://127.0.0.1:{port}: {said}"), line
    assert "second line" not in line and line.endswith(said[-10:])


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"processes": []}, None),
        ({"processes": [], "groups": None}, "no list of processes and groups"),
        ({"processes": [], "interval_seconds": None}, None),
        ({"processes": [], "interval_seconds": 2}, None),
        ({"processes": [], "interval_seconds": True}, "interval_seconds is not a number"),
        ({"processes": [], "interval_seconds": float("inf")}, "interval_seconds is not a number"),
        ({"processes": [{"pid": 0, "comm": "x", "group": {}, "on_cpu_nanos": None}]}, None),
        ({"processes": [{"pid": True, "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": -1, "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": 1, "comm": 5, "group": {}}]}, "processes[0] has no pid and comm"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {1: "a"}}]}, "processes[0].group"),
        ({"processes": [{"pid": 1, "comm": "x", "group": []}]}, "processes[0].group"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {}, "x\x1b" + "y" * 50: 1.5}]},
         "processes[0].x?" + "y" * 38 + " is not a count"),
        ({"processes": [], "groups": [{"group": {"cgroup": "/"}, "pid": "no"}]},
         "groups[0].pid is not a count"),
        ({"processes": [], "groups": [{"group": {"cgroup": "/"}, "processes": 3}, 4]},
         "groups[1] is not an object"),
    ],
)  # fmt: skip
def test_the_shape_of_an_answer_is_checked_field_by_field(document, problem):
    said = top.remote._misshapen(document)
    if problem is None:  # and an answer without groups has an empty list of them
        assert said is None and isinstance(document["groups"], list)
    else:
        assert said is not None and said.startswith(problem), said


@contextlib.contextmanager
def plain_http() -> Iterator[int]:
    """A server on 127.0.0.1 that answers a plain HTTP 400 as soon as a client connects,
    before reading anything (a TLS handshake sent to it, say); its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            sock, _ = server.accept()
            with sock:
                sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        thread.join(10)


def test_what_a_server_sends_that_is_not_a_procdelta_answer_is_named():
    with hostile(answering(b"200 OK", b"{not json")) as (port, _):
        assert fetched(port).endswith(": not a procdelta /processes answer (not a JSON object)")
    with hostile(lambda sock, port: sock.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")) as (port, _):
        assert fetched(port).startswith(f"--from http://127.0.0.1:{port}: not an HTTP answer: ")
    with hostile(lambda sock, port: None) as (port, _):  # closed without a word
        assert fetched(port).endswith(": the connection was closed before an answer (is it https?)")
    with plain_http() as port:  # TLS to plain http
        assert fetched(port, "https").endswith(": TLS: wrong version number (is it plain http?)")
    port = free_port()
    assert fetched(port) == f"--from http://127.0.0.1:{port}: cannot connect: Connection refused"


def test_the_request_says_who_asks_and_with_what(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("pa:ss\n")
    with hostile(answering(b"200 OK", b'{"processes": []}')) as (port, heads):
        remote = top.Remote(f"127.0.0.1:{port}/", username="al", password_file=str(secret))
        selection = top.Selection(cgroup="/x", sort="on_cpu_nanos", limit=None)
        source = top.RemoteFeed(remote, selection)
        assert source.origin == f"http://127.0.0.1:{port}"
        view = source.fetch()
    assert view.document == {"processes": [], "groups": []} and view.pids == {}
    head = heads[0].decode()
    assert head.startswith("GET /processes?cgroup=%2Fx&sort=on_cpu_nanos&limit=0 HTTP/1.1\r\n")
    token = base64.b64encode(b"al:pa:ss").decode()
    assert f"\r\nAuthorization: Basic {token}\r\n" in head
    assert "\r\nAccept: application/json\r\n" in head
    assert f"\r\nUser-Agent: procdelta-top/{collector.__version__}\r\n" in head
    anonymous = top.RemoteFeed(top.Remote("http://h"), top.Selection())
    assert "Authorization" not in anonymous.headers and anonymous.origin == "http://h"
    no_password = top.RemoteFeed(top.Remote("http://h", username="al"), top.Selection())
    assert no_password.headers["Authorization"] == "Basic " + base64.b64encode(b"al:").decode()
    assert no_password.context is None


@contextlib.contextmanager
def tls_server(pki: Path, client_ca: bool = False) -> Iterator[int]:
    """A TLS server on 127.0.0.1 with the test CA's certificate (asking for a client
    certificate the CA signed, where `client_ca`), answering one request `{"processes":
    []}`; its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.crt")
    server = socket.create_server(("127.0.0.1", 0))
    body = b'{"processes": []}'

    def serve() -> None:
        while True:
            try:
                sock, _ = server.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), sock:
                sock.settimeout(5)
                tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                with tls:
                    try:
                        tls.do_handshake()
                    except ssl.SSLError:
                        # the alert is sent: read on (bytes, below TLS) until the client
                        # closes, so that closing with its request unread does not reset
                        # the connection before the client reads the alert (it would see
                        # a reset or an end, not the TLS error)
                        while socket.socket.recv(tls, 65536):
                            pass
                        continue
                    tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    tls.sendall(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)


def test_a_tls_failure_says_what_to_give(pki):
    """An untrusted server names --from.ca-file; one that wants a client certificate
    names --from.cert-file; with them, the answer comes through."""
    with tls_server(pki) as port:
        said = fetched(port, "https")
        assert said == (
            f"--from https://127.0.0.1:{port}: TLS: unable to get local issuer certificate "
            "(give --from.ca-file, or --from.insecure-skip-verify)"
        )
        trusted = top.Remote(f"https://127.0.0.1:{port}", ca_file=str(pki / "ca.crt"))
        assert top.RemoteFeed(trusted, top.Selection()).fetch().document["processes"] == []
    with tls_server(pki, client_ca=True) as port:
        said = fetched(port, "https", ca_file=str(pki / "ca.crt"))
        assert said.startswith(f"--from https://127.0.0.1:{port}: TLS: ")
        assert said.endswith(
            " (does it want a client certificate? --from.cert-file, --from.key-file)"
        )
        certified = top.Remote(f"https://127.0.0.1:{port}", ca_file=str(pki / "ca.crt"),
                               cert_file=str(pki / "client.crt"),
                               key_file=str(pki / "client.key"))  # fmt: skip
        assert top.RemoteFeed(certified, top.Selection()).fetch().document["processes"] == []


@pytest.mark.parametrize(
    ("remote", "said"),
    [
        ({"key_file": "k"}, "--from.key-file needs --from.cert-file"),
        ({"password_file": "p"}, "--from.password-file needs --from.username"),
        ({"username": "u", "password_file": "/nonexistent/p"},
         "--from.password-file /nonexistent/p: No such file or directory"),
    ],
)  # fmt: skip
def test_credentials_that_cannot_be_used_are_one_line(remote, said):
    with pytest.raises(top.BadValue) as raised:
        top.RemoteFeed(top.Remote("http://h", **remote), top.Selection())
    assert str(raised.value) == said


def test_the_client_tls_trusts_what_it_is_told(pki, tmp_path):
    https = top.Remote("https://h", ca_file=str(pki / "ca.crt"))
    context = top.RemoteFeed(https, top.Selection()).context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    insecure = top.remote.tls_context(top.Remote("https://h", insecure_skip_verify=True))
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    top.remote.tls_context(top.Remote("https://h", cert_file=str(pki / "client.crt"),
                                      key_file=str(pki / "client.key")))  # fmt: skip
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for remote, said in (
        (top.Remote("https://h", ca_file=str(tmp_path / "none")),
         f"--from.ca-file {tmp_path / 'none'}: No such file or directory"),
        (top.Remote("https://h", cert_file=str(garbage)), f"--from.cert-file {garbage}: "),
        (top.Remote("https://h", cert_file=str(pki / "client.crt"), key_file=str(pki / "ca.key")),
         f"--from.cert-file {pki / 'client.crt'}: key values mismatch"),
    ):  # fmt: skip
        with pytest.raises(top.BadValue) as raised:
            top.remote.tls_context(remote)
        assert str(raised.value).startswith(said) and "\n" not in str(raised.value)
        assert said.endswith(": ") or str(raised.value) == said


@pytest.mark.parametrize(
    ("url", "asked"),
    [
        ("h:1", "http://h:1/processes?a=b"),
        ("https://h", "https://h/processes?a=b"),
        ("http://h:1/x/", "http://h:1/x/processes?a=b"),
        ("http://h:1/processes", "http://h:1/processes?a=b"),
        ("http://h:1/processes/?old=1", "http://h:1/processes?a=b"),
    ],
)
def test_the_processes_url_of_a_base_url(url, asked):
    assert top.processes_url(url, {"a": "b"}) == asked


@pytest.mark.parametrize("url", ["ftp://h", "http://", "h:port", "http://[::1", "https:///x"])
def test_a_url_that_is_no_server_is_refused(url):
    with pytest.raises(top.BadValue, match="want http://HOST:PORT or https://HOST:PORT"):
        top.processes_url(url, {})


def test_a_redirect_is_not_followed_with_the_credentials(tmp_path):
    """procdelta serve never redirects: a 302 to another port (where the credentials would
    go) is an error, and the other port hears nothing."""
    with hostile(lambda sock, port: None) as (elsewhere, stolen):

        def redirect(sock: socket.socket, port: int) -> None:
            sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/processes\r\n"
                         b"Content-Length: 0\r\n\r\n" % elsewhere)  # fmt: skip

        with hostile(redirect) as (port, heads):
            secret = tmp_path / "password"
            secret.write_text("s3cret\n")
            result = top_from(port, "--from.username", "alice", "--from.password-file", str(secret))
    assert_one_line_error(result, "302", "redirects", "not followed", status=1)
    assert len(heads) == 1 and b"Authorization: Basic" in heads[0]
    assert stolen == []


def test_what_a_server_says_reaches_the_terminal_as_printable_text():
    """An error's text with a terminal's escape sequences (a window title, a screen
    clear) comes through with none of them."""

    def evil(sock: socket.socket, port: int) -> None:
        body = b"\x1b]0;pwned\x07\x1b[2J\x1b[31mred\n"
        sock.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(evil) as (port, _):
        result = top_from(port)
    assert_one_line_error(result, "500", "pwned", "red", status=1)
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_an_answer_too_large_is_refused_without_holding_it():
    """An answer of up to 1 GiB: read up to the cap, then an error."""

    def huge(sock: socket.socket, port: int) -> None:
        # no length said: up to 1 GiB, until the client stops reading
        sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        chunk = b"0" * (1 << 20)
        for _ in range(1024):
            sock.sendall(chunk)

    with hostile(huge) as (port, _):
        # in 400 MiB of address space: the answer held whole would not fit
        result = subprocess.run(
            ["prlimit", f"--as={400 << 20}", sys.executable, "-m", "collector", "top",
             "--from", f"http://127.0.0.1:{port}", "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert_one_line_error(result, "over 16 MiB", "no procdelta /processes answer", status=1)


def test_a_server_that_trickles_is_cut_off_at_the_deadline(monkeypatch):
    """A byte every 0.2 s never trips a read's timeout; the whole GET has one deadline."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 1.0)

    def trickle(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(50):
            sock.sendall(b" ")
            time.sleep(0.2)

    with hostile(trickle) as (port, _):
        source = top.RemoteFeed(top.Remote(f"http://127.0.0.1:{port}"), top.Selection())
        started = time.monotonic()
        with pytest.raises(top.TopError, match="no answer within 1s"):
            source.fetch()
        assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "not a JSON object"),
        ({"processes": {}}, "no list of processes"),
        ({"processes": [], "interval_seconds": "soon"}, "interval_seconds"),
        ({"processes": [7]}, "processes[0] is not an object"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {"pod": 1}}]}, "processes[0].group"),
        ({"processes": [{"pid": "1", "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {}, "on_cpu_nanos": -5}]},
         "processes[0].on_cpu_nanos is not a count"),
        ({"processes": [], "groups": [{"group": {}, "run_delay_nanos": 1.5}]},
         "groups[0].run_delay_nanos is not a count"),
    ],
)  # fmt: skip
def test_a_document_of_another_shape_is_refused_before_it_is_drawn(document, problem):
    def answer(sock: socket.socket, port: int) -> None:
        body = json.dumps(document).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(answer) as (port, _):
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}")
    assert_one_line_error(result, "not a procdelta /processes answer", problem, status=1)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"processes": [], "timestamp": NaN}', "not a JSON object"),
        (b'{"processes": [], "interval_seconds": Infinity}', "not a JSON object"),
        (b'{"processes": [], "timestamp": 1e300}', "timestamp is not a number"),
        (b'{"processes": [], "timestamp": "now"}', "timestamp is not a number"),
        (b'{"processes": [{"pid": 1, "comm": "x", "group": {}, '
         b'"on_cpu_nanos": 18446744073709551616}]}',
         "processes[0].on_cpu_nanos is not a count"),
        (b'{"processes": [{"pid": 99999999999999999999999, "comm": "x", "group": {}}]}',
         "processes[0] has no pid"),
        (b'{"processes": [], "x": ' + b"9" * 5000 + b"}", "not a JSON object"),
        (b'{"processes": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not a JSON object"),
    ],
)  # fmt: skip
def test_values_top_cannot_draw_are_refused_in_one_line(body, problem):
    """What passes for JSON but cannot be drawn: NaN or infinite clocks, counts past the
    kernel's 64 bits, numbers past Python's digits, nesting past the stack: one line
    naming the answer, never a traceback."""

    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(answer) as (port, _):
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json")
    assert_one_line_error(result, "not a procdelta /processes answer", problem, status=1)


def test_an_answer_of_tiny_values_is_refused_before_it_is_parsed():
    """16 MiB of `{},` would cost some 400 MiB to parse: an answer of more values than a
    node's processes have is refused before parsing, in 200 MiB of address space."""
    body = b"[" + b"{}," * ((top.remote.MAX_ANSWER_BYTES // 3) - 1) + b"{}]"

    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.sendall(body)

    with hostile(answer) as (port, _):
        result = subprocess.run(
            ["prlimit", f"--as={200 << 20}", sys.executable, "-m", "collector", "top",
             "--from", f"http://127.0.0.1:{port}", "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert_one_line_error(result, "values is no procdelta /processes answer", status=1)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (b"500 ", b"", "500 "),  # no reason, no body: the status alone
        (b"500 Oops", b"x" * 300, "500 " + "x" * 200),
        (b"503 Busy", b"\xffbusy\n", "503 \ufffdbusy"),  # not UTF-8: shown, not an error
        (b"300 Multiple Choices", b"", "300: the server redirects, which procdelta serve "
         "never does; not followed (--from takes the server's own base URL)"),
    ],
)  # fmt: skip
def test_a_refusal_is_exactly_its_status_and_what_the_server_said(status, body, said):
    with hostile(answering(status, body)) as (port, _):
        assert fetched(port) == f"--from http://127.0.0.1:{port}: {said}"


def test_a_password_file_is_read_as_utf8_whatever_the_locale(tmp_path):
    """The password's bytes are sent as written (UTF-8), under a locale of another
    encoding too; a file that is not UTF-8 is one line naming it."""
    secret = tmp_path / "password"
    secret.write_bytes("pässword\n".encode())
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # ASCII
    try:
        source = top.RemoteFeed(
            top.Remote("http://h", username="al", password_file=str(secret)), top.Selection()
        )
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    token = base64.b64encode("al:pässword".encode()).decode()
    assert source.headers["Authorization"] == f"Basic {token}"
    secret.write_bytes(b"\xff\n")
    with pytest.raises(top.BadValue) as raised:
        top.RemoteFeed(
            top.Remote("http://h", username="al", password_file=str(secret)), top.Selection()
        )
    assert str(raised.value) == (
        f"--from.password-file {secret}: 'utf-8' codec can't decode byte 0xff in position 0: "
        "invalid start byte"
    )


def ssl_error(text: str, reason: str) -> ssl.SSLError:
    """An SSLError as OpenSSL's come: its text and its reason."""
    error = ssl.SSLError(1, text)
    error.reason = reason
    return error


def verify_error(message: str | None) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = message
    return error


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (verify_error(None), "TLS: certificate verify failed (give --from.ca-file, or "
         "--from.insecure-skip-verify)"),
        (ssl_error("[SSL: SOME_ALERT] some alert", "SOME_ALERT"), "TLS: some alert"),
        (ssl_error("[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] sslv3 alert handshake failure",
                   "SSLV3_ALERT_HANDSHAKE_FAILURE"), "TLS: sslv3 alert handshake failure "
         "(does it want a client certificate? --from.cert-file, --from.key-file)"),
        (ssl_error("[SSL: RECORD_LAYER_FAILURE] record layer failure", "RECORD_LAYER_FAILURE"),
         "TLS: record layer failure (is it plain http?)"),
        (ConnectionResetError(104, "Connection reset by peer"),
         "the connection was closed before an answer (is it https?)"),
        (http.client.BadStatusLine("SSH-2.0-OpenSSH\r\n"),
         "not an HTTP answer: BadStatusLine('SSH-2.0-OpenSSH\\r\\n')"),
        (ValueError("x" * 300), "cannot connect: " + "x" * 200),
    ],
    ids=["unverified", "tls", "handshake", "record-layer", "reset", "not-http", "other"],
)  # fmt: skip
def test_each_way_a_server_cannot_be_reached_is_said_with_what_to_try(reason, said):
    assert top.remote._unreachable(reason) == said


def test_each_connection_of_from_waits_the_request_timeout_at_most(monkeypatch):
    """Connecting and each read are bounded by REQUEST_TIMEOUT, over http and https (the
    deadline's timer cannot cut a connect short: there is no socket yet to shut)."""
    timeouts: list[float | None] = []
    connect = socket.create_connection

    def recording(address, timeout=None, *args, **kwargs):
        timeouts.append(timeout)
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(top.remote.socket, "create_connection", recording)
    port = free_port()  # nothing listens there
    for scheme in ("http", "https"):
        assert fetched(port, scheme).endswith(": cannot connect: Connection refused")
    assert timeouts == [top.REQUEST_TIMEOUT, top.REQUEST_TIMEOUT]


def test_an_answer_over_the_cap_is_refused_as_soon_as_the_cap_is_passed(monkeypatch):
    """One byte past the cap is read, no more: an answer that says it is larger is refused
    then, without waiting for the rest (which the server may never send)."""
    monkeypatch.setattr(top.remote, "MAX_ANSWER_BYTES", 1 << 20)
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 2.0)
    done = threading.Event()

    def stalls(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        sock.sendall(b" " * ((1 << 20) + 1))
        done.wait(10)  # the rest never comes

    with hostile(stalls) as (port, _):
        try:
            said = fetched(port)
        finally:
            done.set()
    assert said.endswith(": an answer over 1 MiB is no procdelta /processes answer"), said


def test_a_server_that_trickles_its_status_line_is_cut_off_at_the_deadline(monkeypatch):
    """The deadline cuts the exchange wherever it is: in the status line, what was read
    of it is no answer within the deadline, not a malformed answer."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 0.5)

    def trickle(sock: socket.socket, port: int) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
            sock.sendall(bytes([byte]))
            time.sleep(0.1)

    with hostile(trickle) as (port, _):
        said = fetched(port)
    assert said == (
        f"--from http://127.0.0.1:{port}: no answer within 0.5s (an https URL for a plain "
        "http serve?)"
    )


@contextlib.contextmanager
def thread_errors() -> Iterator[list]:
    """The exceptions that end a thread meanwhile (each one a traceback on stderr)."""
    raised: list = []
    hook = threading.excepthook
    threading.excepthook = raised.append
    try:
        yield raised
    finally:
        threading.excepthook = hook


def test_the_deadline_cuts_a_tls_handshake_and_the_body_of_a_closing_answer(monkeypatch):
    """The deadline cuts the exchange wherever the server trickles: during the TLS
    handshake (the socket then held by TLS) and during the body of an answer that says it
    closes the connection (the socket then held by the answer, not the connection). Each
    server would trickle for 3 s; the fetch ends at the deadline of 0.5 s, said in one
    line, and the deadline's timer leaves no traceback."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 0.5)

    def handshake(sock: socket.socket, port: int) -> None:
        sock.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16 KiB, trickled
        for _ in range(30):
            sock.sendall(b"\x00")
            time.sleep(0.1)

    def closing(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 40\r\n\r\n")
        for _ in range(30):
            sock.sendall(b" ")
            time.sleep(0.1)

    for scheme, answer in (("https", handshake), ("http", closing)):
        with thread_errors() as raised, hostile(answer, read_head=scheme == "http") as (port, _):
            started = time.monotonic()
            said = fetched(port, scheme, insecure_skip_verify=scheme == "https")
            took = time.monotonic() - started
            for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
                timer.join(5)
        assert said.endswith(": no answer within 0.5s (an https URL for a plain http serve?)")
        assert took < 2.0, (scheme, took)  # not the 3 s the server trickles for
        assert raised == []


def test_a_server_without_the_processes_view_is_one_line():
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics", None, None, processes=False)
    with contextlib.ExitStack() as stack:
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        stack.callback(thread.join, 10)
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        port = server.server_address[1]
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}/", "--format", "json")
        wrong = procdelta("top", "--from", f"http://127.0.0.1:{port}/metrics", "--format", "json")
    assert_one_line_error(result, "404", "/processes", "--no-web.processes", status=1)
    # a URL with a path: the one asked is named, and what --from takes
    assert_one_line_error(wrong, "404", "/metrics/processes", "base URL", status=1)


def test_the_served_document_comes_through_whole():
    """With --from, the JSON is the server's own document: its interval, its processes."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    with serving(loop) as port:
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    # without credentials: no process's storage bytes, and the document says so
    assert set(document) == {"interval_seconds", "timestamp", "processes", "groups", "withheld"}
    assert document["withheld"] == ["read_bytes", "write_bytes"]
    assert document["processes"] == []  # the counting engine keeps no process table

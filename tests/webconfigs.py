"""Helpers of the tests of `--web.config.file` (tests/integration/test_webconfig_*.py and the
tests of TLS and of `top` against a served page): a PKI made by openssl (the `pki` fixture,
registered by tests/conftest.py), web configs, clients with and without credentials."""

from __future__ import annotations

import base64
import contextlib
import http.client
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from collector import webconfig
from collector.admission import Limits
from collector.passloop import PassLoop
from tests.integration.test_serve import CountingEngine, serving
from tests.needs import tool
from tests.net import free_port, request, start_serve, wait_until

PASSWORD = "s3cret pass"


def openssl(*args: str, cwd: Path) -> None:
    binary = tool("openssl", "openssl")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by
    it, and a self-signed client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=procdelta test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"),
                            ("client", "extendedKeyUsage=clientAuth")):  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=d)  # fmt: skip
    # a client certificate no CA of the server's signed
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=stranger", "-keyout", "stranger.key", "-out", "stranger.crt", cwd=d)  # fmt: skip
    return d


def write_config(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


def users_block() -> str:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    return f"basic_auth_users:\n  alice: '{hashed}'\n"


def start(config: Path):
    port = free_port()
    return start_serve(port, "--web.config.file", str(config)), port


def client_context(pki: Path, with_cert: bool | str = False) -> ssl.SSLContext:
    """A client trusting the test CA; `with_cert`: presenting the client certificate
    (True, or the name of another: "stranger")."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if with_cert:
        name = "client" if with_cert is True else with_cert
        context.load_cert_chain(str(pki / f"{name}.crt"), str(pki / f"{name}.key"))
    return context


def get(port: int, context: ssl.SSLContext | None, user: str | None = None,
        password: str = PASSWORD, path: str = "/metrics") -> int:  # fmt: skip
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return request(port, path, headers=headers, context=context)[0]


@contextlib.contextmanager
def serving_config(config: Path, limits: Limits | None = None) -> Iterator[int]:
    """An in-process server with the web configuration `config`, on 127.0.0.1."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    with serving(loop, web=webconfig.load(str(config)), limits=limits) as port:
        yield port


def admitted(port: int, context: ssl.SSLContext) -> bool:
    try:
        return request(port, context=context)[0] == 200
    except (ssl.SSLError, ConnectionError, OSError, http.client.HTTPException):
        return False


def only(pki: Path, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client with the client certificate that speaks `version` of TLS and no other."""
    context = client_context(pki, True)
    context.minimum_version = context.maximum_version = version
    return context


TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


def users_config(directory: Path, **passwords: str) -> Path:
    lines = [f"  {user}: '{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}'"
             for user, pw in passwords.items()]  # fmt: skip
    path = directory / "web.yml"
    # a Secret's update: the new file is written aside and renamed over the old one
    aside = directory / "web.yml.new"
    aside.write_text("basic_auth_users:\n" + "\n".join(lines) + "\n")
    aside.replace(path)
    return path


def at_once(work) -> None:
    """A `WebConfigFile`'s re-read run in the caller's thread, done when it returns."""
    work()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def trusted(port: int, context: ssl.SSLContext) -> bool:
    try:
        return get(port, context) == 200
    except ssl.SSLCertVerificationError:
        return False


def hash_of_cost(cost: int) -> str:
    """A well-formed bcrypt hash of `cost` made without paying for it: a cost-4 hash with
    the cost field rewritten (what bcrypt reads of it before its work)."""
    cheap = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=4)).decode()
    return f"{cheap[:4]}{cost:02d}{cheap[6:]}"


def tls_dir(pki: Path, tmp_path: Path) -> None:
    for name in ("server.crt", "server.key", "ca.crt", "stranger.crt"):
        shutil.copy(pki / name, tmp_path / name)


@contextlib.contextmanager
def kept_alive(port: int, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        yield sock


def ask(sock: ssl.SSLSocket, path: str = "/metrics", user: str | None = "alice") -> bytes:
    """One request on a kept-alive connection: the answer's status line, or b"" where the
    server closed it instead."""
    headers = "Host: x\r\n"
    if user is not None:
        token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        headers += f"Authorization: Basic {token}\r\n"
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\n{headers}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            head += chunk
    except (ConnectionError, ssl.SSLError):
        return b""
    status, _, rest = head.partition(b"\r\n\r\n")[0].partition(b"\r\n")
    length = int(next(line.split(b":")[1] for line in rest.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))  # fmt: skip
    body = head.partition(b"\r\n\r\n")[2]
    while len(body) < length:
        body += sock.recv(65536)
    return status


def server_closed(sock: ssl.SSLSocket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def swapped_in(web: webconfig.WebConfigFile, port: int, context: ssl.SSLContext, check) -> None:
    """Wait until a new connection (which looks at the file) finds `check(web.current())`."""

    def looked() -> bool:
        with contextlib.suppress(OSError, ssl.SSLError, http.client.HTTPException):
            get(port, context, "alice")
        return check(web.current())

    wait_until(looked, 10, "the new configuration in force")


@contextlib.contextmanager
def serving_config_file(web: webconfig.WebConfigFile, listener_of: list | None = None):
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()

    def kept(server) -> None:
        if listener_of is not None:
            server.listener.tls_at_start = web.current().tls.terms
            listener_of.append(server.listener)

    with serving(loop, web=web, before=kept) as port:
        yield port

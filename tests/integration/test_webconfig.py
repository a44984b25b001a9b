"""Access control like the official exporters: `--web.config.file` with TLS and bcrypt
basic auth, against a real `procdelta serve`, with certificates made by openssl."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from collector import webconfig
from collector.exporter import make_server
from collector.listener import Limits
from collector.passloop import PassLoop
from tests.integration.test_cli import assert_one_line_error
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


def test_tls_and_basic_auth(pki):
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          "  key_file: server.key\n" + users_block())  # fmt: skip
    process, port = start(config)
    try:
        context = client_context(pki)
        wait_until(lambda: get(port, context, "alice") == 200, 30, "TLS with credentials")
        assert get(port, context) == 401
        assert get(port, context, "alice", "wrong") == 401
        assert get(port, context, "mallory") == 401
        assert get(port, context, "alice") == 200
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            get(port, None, "alice")  # plain HTTP to the TLS port is refused
        assert get(port, context, "alice") == 200  # and did not hurt the server
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert 'msg="starting procdelta"' in stderr and " tls=true basic_auth=true " in stderr


def test_client_certificates_required(pki):
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          "  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n"
                          "  client_ca_file: ca.crt\n")  # fmt: skip
    process, port = start(config)
    try:
        with_cert = client_context(pki, with_cert=True)
        wait_until(lambda: get(port, with_cert) == 200, 30, "TLS with a client certificate")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            get(port, client_context(pki))
    finally:
        process.terminate()
        process.communicate(timeout=10)


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


# exporter-toolkit passes client_auth_type to Go's crypto/tls unchanged: Request* ask for
# a certificate and never verify it, *Verify* verify what they get against client_ca_file.
CLIENT_AUTH_MODES = [
    # mode, with the CA file, admitted: (no certificate, the CA's, a self-signed one)
    ("NoClientCert", False, (True, True, True)),
    ("RequestClientCert", False, (True, True, True)),
    ("RequireAnyClientCert", False, (False, True, True)),
    ("VerifyClientCertIfGiven", True, (True, True, False)),
    ("RequireAndVerifyClientCert", True, (False, True, False)),
]


@pytest.mark.parametrize(("mode", "with_ca", "expected"), CLIENT_AUTH_MODES,
                         ids=[m[0] for m in CLIENT_AUTH_MODES])  # fmt: skip
def test_client_certificate_modes_mean_what_exporter_toolkits_mean(pki, mode, with_ca, expected):
    ca = "  client_ca_file: ca.crt\n" if with_ca else ""
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          f"  key_file: server.key\n  client_auth_type: {mode}\n{ca}")  # fmt: skip
    with serving_config(config) as port:
        clients = (client_context(pki), client_context(pki, True), client_context(pki, "stranger"))
        assert tuple(admitted(port, client) for client in clients) == expected


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize("mode", ["NoClientCert", "RequireAnyClientCert"])
def test_tls_below_1_2_is_refused_by_default(pki, mode):
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          f"  key_file: server.key\n  client_auth_type: {mode}\n")  # fmt: skip
    old = client_context(pki, True)
    old.minimum_version = ssl.TLSVersion.TLSv1
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with contextlib.suppress(ssl.SSLError):
        old.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client would speak TLS 1.0 and 1.1
    with serving_config(config) as port:
        assert admitted(port, client_context(pki, True))
        assert not admitted(port, old)


def test_pyopenssl_is_loaded_only_for_the_modes_that_need_it(pki):
    """cryptography and pyOpenSSL weigh megabytes of RSS: `serve` loads them only for
    RequestClientCert and RequireAnyClientCert."""
    code = (
        "import sys; from collector import cli, exporter, listener, webconfig;"
        "webconfig.load(sys.argv[1]); print('OpenSSL' in sys.modules, "
        "'cryptography' in sys.modules)"
    )
    for mode, loaded in (("RequireAndVerifyClientCert", "False False"),
                         ("RequireAnyClientCert", "True True")):  # fmt: skip
        config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                              f"  key_file: server.key\n  client_auth_type: {mode}\n"
                              "  client_ca_file: ca.crt\n")  # fmt: skip
        result = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True,
                                text=True, timeout=60, check=True)  # fmt: skip
        assert result.stdout.strip() == loaded, mode


def test_the_minimum_version_is_tls_1_2_unless_set(pki, tmp_path):
    base = "tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/server.key\n"
    default = webconfig.load(str(write_config(tmp_path, base.format(d=pki))))
    assert default.tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    text = base.format(d=pki) + "  min_version: TLS13\n"
    assert webconfig.load(str(write_config(tmp_path, text))).tls.context.minimum_version == (
        ssl.TLSVersion.TLSv1_3
    )


def only(pki: Path, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client with the client certificate that speaks `version` of TLS and no other."""
    context = client_context(pki, True)
    context.minimum_version = context.maximum_version = version
    return context


# the web config's bounds: whether a TLS 1.2 client and a TLS 1.3 one are admitted
VERSION_BOUNDS = [
    ("", (True, True)),
    ("  min_version: TLS13\n", (False, True)),
    ("  max_version: TLS12\n", (True, False)),
    ("  min_version: TLS12\n  max_version: TLS12\n", (True, False)),
    ("  min_version: TLS13\n  max_version: TLS13\n", (False, True)),
]


@pytest.mark.parametrize("mode", [mode for mode, with_ca, _ in CLIENT_AUTH_MODES if not with_ca])
def test_min_and_max_version_hold_in_every_client_certificate_mode(pki, tmp_path, mode):
    """min_version and max_version bound the TLS versions a client may speak, the same in
    the modes served by pyOpenSSL (RequestClientCert, RequireAnyClientCert) as in those
    served by `ssl`: a TLS 1.2 client is refused under min_version TLS13, a TLS 1.3 one
    under max_version TLS12, and each is admitted where its version is allowed."""
    tls12, tls13 = only(pki, ssl.TLSVersion.TLSv1_2), only(pki, ssl.TLSVersion.TLSv1_3)
    base = (f"tls_server_config:\n  cert_file: {pki}/server.crt\n"
            f"  key_file: {pki}/server.key\n  client_auth_type: {mode}\n")  # fmt: skip
    for bound, expected in VERSION_BOUNDS:
        with serving_config(write_config(tmp_path, base + bound)) as port:
            assert (admitted(port, tls12), admitted(port, tls13)) == expected, bound


@pytest.mark.parametrize("first_bytes", [b"", b"\x16\x03\x01\x02\x00\x01"])
def test_a_tls_handshake_has_the_request_heads_deadline(pki, first_bytes):
    """A client that opens a connection to the TLS port and sends nothing, or a handshake's
    first bytes only, is cut off at the deadline (1 s here, 10 s by default)."""
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          "  key_file: server.key\n")  # fmt: skip
    with serving_config(config, Limits(header_timeout=1.0)) as port:
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(first_bytes)
            stalled.settimeout(8)
            with contextlib.suppress(ConnectionResetError):
                assert stalled.recv(1) == b""
        assert admitted(port, client_context(pki))


def test_basic_auth_without_tls(tmp_path):
    """Every path is guarded, /healthz too (the chart's probes check the port only); a
    password of any length, a malformed header, a user name that is not UTF-8: each is a
    401 and no traceback, and the refusals are logged a line at a time, rate-limited."""
    long_password = "x" * 80  # a user may have one: bcrypt reads its first 72 bytes
    hashed = bcrypt.hashpw(long_password.encode()[:72], bcrypt.gensalt(rounds=4)).decode()
    config = write_config(tmp_path, users_block() + f"  bob: '{hashed}'\n")
    process, port = start(config)
    try:
        # healthy once the first pass completed, which /metrics does not wait for
        wait_until(lambda: get(port, None, "alice", path="/healthz") == 200, 30, "basic auth")
        assert get(port, None) == 401
        assert get(port, None, path="/healthz") == 401
        assert get(port, None, "alice") == 200
        assert get(port, None, path="/") == 401
        assert get(port, None, "bob", long_password) == 200
        assert get(port, None, "alice", "y" * 100) == 401
        assert get(port, None, "alice", "z" * 10_000) == 401
        assert get(port, None, "mallory", "y" * 100) == 401
        for header in ("Basic " + base64.b64encode(b"\xff\xfe:pw").decode(),
                       "Basic " + base64.b64encode(b"no-colon").decode(),
                       "Basic !!!", "Basic", "Bearer abc", "basic " + "A" * 30_000):  # fmt: skip
            assert request(port, headers={"Authorization": header})[0] == 401, header
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert "Traceback" not in stderr
    refused = [line for line in stderr.splitlines() if "refused 127.0.0.1" in line]
    assert 1 <= len(refused) <= 2, refused  # 13 refusals, one line every 10 s


def test_an_unknown_user_costs_a_bcrypt_check_of_the_same_cost(monkeypatch):
    """No timing oracle: an unknown user's password is checked against a dummy hash of the
    users' cost (exporter-toolkit's defence), and refused even if it matched."""
    known = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=5))
    config = webconfig.WebConfig(users={"bob": known})
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def recording(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", recording)
    assert not config.authorized("Basic " + base64.b64encode(b"mallory:pw").decode())
    assert not config.authorized("Basic " + base64.b64encode(b"bob:wrong").decode())
    dummy, real_hash = checked
    assert real_hash == known and dummy != known
    assert dummy.split(b"$")[2] == b"05"  # the users' cost
    monkeypatch.setattr(webconfig.bcrypt, "checkpw", lambda password, hashed: True)
    assert not config.authorized("Basic " + base64.b64encode(b"mallory:pw").decode())


def test_bcrypt_checks_run_one_at_a_time(monkeypatch):
    """Wrong passwords cost one CPU at most: bcrypt checks are serialized."""
    config = webconfig.WebConfig(users={"bob": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))})
    running = []
    overlapped = threading.Event()
    lock = threading.Lock()

    def slow(password: bytes, hashed: bytes) -> bool:
        with lock:
            running.append(1)
            if len(running) > 1:
                overlapped.set()
        time.sleep(0.05)
        with lock:
            running.pop()
        return False

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", slow)
    header = "Basic " + base64.b64encode(b"bob:wrong").decode()
    threads = [threading.Thread(target=config.authorized, args=(header,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not overlapped.is_set()


def test_any_password_length_is_a_refusal_or_a_login():
    hashed = bcrypt.hashpw(b"p" * 72, bcrypt.gensalt(rounds=4))
    config = webconfig.WebConfig(users={"bob": hashed})
    assert config.authorized("Basic " + base64.b64encode(b"bob:" + b"p" * 90).decode())
    assert not config.authorized("Basic " + base64.b64encode(b"bob:" + b"q" * 90).decode())
    assert not config.authorized("Basic " + base64.b64encode(b"bob:a\x00b").decode())


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", ["cert_file"]),
        ("tls_server_config:\n  cert_file: server.crt\n", ["key_file"]),
        ("basic_auth_users:\n  alice: plaintext\n", ["alice", "bcrypt"]),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: Sometimes\n",
            ["client_auth_type"],
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            ["client_ca_file"],
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            ["cipher_suites"],
        ),
        ("http_server_config:\n  http2: false\n", ["http_server_config"]),
        ("[not, a, mapping]\n", ["mapping"]),
        ("basic_auth_users: {\n", ["YAML"]),
    ],
)
def test_an_invalid_web_config_is_one_clear_error_at_start_up(pki, tmp_path, text, words):
    for name in ("server.crt", "server.key"):
        shutil.copy(pki / name, tmp_path / name)
    config = write_config(tmp_path, text)
    result = subprocess.run(
        [sys.executable, "-m", "collector", "serve", "--web.listen-address", "127.0.0.1:0",
         "--web.config.file", str(config)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert_one_line_error(result, "--web.config.file", *words)


TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
# a web config, and the error that names what is wrong in it (after "web.yml: ")
LOAD_ERRORS = [
    ("[not, a, mapping]\n", "want a mapping at the top"),
    ("zzz: 1\nhttp_server_config: {}\n", "unknown or unsupported field 'http_server_config'"),
    ("tls_server_config: [a]\n", "tls_server_config: want a mapping"),
    (TLS + "  curve_preferences: []\n  cipher_suites: []\n",
     "tls_server_config: unknown or unsupported field 'cipher_suites'"),
    ("tls_server_config:\n  cert_file: server.crt\n",
     "tls_server_config: cert_file and key_file are required"),
    ("tls_server_config:\n  key_file: server.key\n",
     "tls_server_config: cert_file and key_file are required"),
    (TLS + "  min_version: TLS9\n", "tls_server_config: min_version: unsupported value 'TLS9'"),
    (TLS + "  max_version: 1.3\n", "tls_server_config: max_version: unsupported value 1.3"),
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
     "tls_server_config: cannot load cert_file/key_file: No such file or directory"),
    ("tls_server_config:\n  cert_file: web.yml\n  key_file: web.yml\n",
     "tls_server_config: cannot load cert_file/key_file: [SSL] PEM lib"),
    (TLS + "  client_auth_type: Sometimes\n",
     "tls_server_config: client_auth_type: unsupported value 'Sometimes'"),
    (TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: missing.crt\n",
     "tls_server_config: cannot load client_ca_file: No such file or directory"),
    (TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: web.yml\n",
     "tls_server_config: cannot load client_ca_file: [X509: NO_CERTIFICATE_OR_CRL_FOUND]"),
    (TLS + "  client_auth_type: VerifyClientCertIfGiven\n",
     "tls_server_config: VerifyClientCertIfGiven needs a client_ca_file"),
    (TLS + "  client_auth_type: RequireAndVerifyClientCert\n",
     "tls_server_config: RequireAndVerifyClientCert needs a client_ca_file"),
    ("basic_auth_users: [alice]\n", "basic_auth_users: want user: bcrypt-hash pairs"),
    ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users: alice: not a bcrypt hash"),
    ("basic_auth_users: {\n", "not YAML: while parsing a flow node"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "error"), LOAD_ERRORS)
def test_a_bad_web_config_names_the_file_the_field_and_the_value(pki, tmp_path, text, error):
    """What start-up (and a reload's log line) says of a file that cannot be used: the
    file, the field and the value it refuses, or what the OS or OpenSSL said of a file it
    names; one line, from the beginning of what is wrong."""
    for name in ("server.crt", "server.key"):
        shutil.copy(pki / name, tmp_path / name)
    path = str(write_config(tmp_path, text))
    with pytest.raises(webconfig.WebConfigError) as raised:
        webconfig.load(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {error}"), message
    assert "\n" not in message
    if not error.endswith("]") and "PEM lib" not in error:
        assert message == f"{path}: {error}"


def test_a_missing_web_config_file(tmp_path):
    with pytest.raises(webconfig.WebConfigError, match="No such file"):
        webconfig.load(str(tmp_path / "absent.yml"))


def test_verified_credentials_are_remembered():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    config = webconfig.WebConfig(users={"bob": hashed})
    header = "Basic " + base64.b64encode(b"bob:pw").decode()
    assert config.authorized(header) and config.authorized(header)
    assert len(config._verified) == 1
    assert not config.authorized("Basic " + base64.b64encode(b"bob:other").decode())
    assert not config.authorized("Basic !!!not-base64")
    assert not config.authorized("Bearer token")


def test_refused_credentials_do_not_take_the_places_of_scrapes(tmp_path, monkeypatch):
    """--web.max-requests bounds the scrapes answered at once, as node_exporter's does
    (promhttp's MaxRequestsInFlight, behind exporter-toolkit's basic auth): a client
    without the password, whose bcrypt checks wait their turn, must not hold those places
    and turn away a scraper whose credentials are verified already."""
    config = write_config(tmp_path, users_block())
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics", webconfig.load(str(config)),
                         Limits(max_requests=2))  # fmt: skip
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    release = threading.Event()
    real = bcrypt.checkpw

    def slow(password: bytes, hashed: bytes) -> bool:
        if password == b"wrong":
            release.wait(20)  # a costly hash, as long as the test needs
        return real(password, hashed)

    port = server.server_address[1]
    attackers: list[threading.Thread] = []
    try:
        assert get(port, None, "alice") == 200  # verified, then remembered
        monkeypatch.setattr(webconfig.bcrypt, "checkpw", slow)
        attackers = [
            threading.Thread(target=get, args=(port, None, "mallory", "wrong")) for _ in range(2)
        ]
        for attacker in attackers:
            attacker.start()
        admission = server.listener.admission
        wait_until(lambda: admission.connections >= 2, 10, "two refused clients waiting")
        time.sleep(0.2)  # their checks queued
        assert get(port, None, "alice") == 200
    finally:
        release.set()
        for attacker in attackers:
            attacker.join(20)
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_remembered_credentials_are_one_per_password_bcrypt_reads():
    """bcrypt reads 72 bytes of a password: the bytes after them must not make another
    remembered entry each (one check apiece, then memory for ever)."""
    password = b"p" * 72
    config = webconfig.WebConfig(users={"bob": bcrypt.hashpw(password, bcrypt.gensalt(rounds=4))})
    for suffix in (b"", b"a", b"b", b"c"):
        header = "Basic " + base64.b64encode(b"bob:" + password + suffix).decode()
        assert config.authorized(header)
    assert len(config._verified) == 1


# -- the file re-read -----------------------------------------------------------------------


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


def test_a_changed_web_config_takes_effect_without_a_restart(tmp_path, caplog):
    """As exporter-toolkit re-reads its file: a user removed and a password changed take
    effect at the first look after the change (at most once a second), remembered
    passwords included; a file that no longer loads keeps the last good one, said once."""
    clock = Clock()
    users_config(tmp_path, alice="old", bob="bob")
    web = webconfig.WebConfigFile(str(tmp_path / "web.yml"), monotonic=clock, run=at_once)
    assert web.current().authorized(auth("alice", "old"))
    assert web.current().authorized(auth("bob", "bob"))
    users_config(tmp_path, alice="new")
    assert web.current().authorized(auth("bob", "bob"))  # not looked at again within 1 s
    clock.now += 1
    assert not web.current().authorized(auth("bob", "bob"))  # removed
    assert not web.current().authorized(auth("alice", "old"))  # remembered, then forgotten
    assert web.current().authorized(auth("alice", "new"))
    good = web.current()
    caplog.set_level("INFO", logger="procdelta")
    for broken in ("basic_auth_users: [not, a, mapping\n", None):
        caplog.clear()
        if broken is None:
            (tmp_path / "web.yml").unlink()
        else:
            (tmp_path / "web.yml").write_text(broken)
        for _ in range(3):
            clock.now += 1
            assert web.current() is good
        (line,) = [r.getMessage() for r in caplog.records]
        assert "not reloaded, the last good one stays" in line
        assert ("not YAML" if broken else "No such file") in line
    users_config(tmp_path, carol="c")
    clock.now += 1
    assert web.current().authorized(auth("carol", "c"))
    assert "reloaded" in caplog.records[-1].getMessage()


def test_a_certificate_renewed_in_place_is_served_to_new_connections(pki, tmp_path):
    """The files the configuration names are looked at too: a certificate and key
    replaced under the same names (cert-manager's renewal) reach the next connection."""
    # before: a certificate the client does not trust (self-signed, another name)
    shutil.copy(pki / "stranger.crt", tmp_path / "server.crt")
    shutil.copy(pki / "stranger.key", tmp_path / "server.key")
    config = write_config(tmp_path, "tls_server_config:\n  cert_file: server.crt\n"
                          "  key_file: server.key\n")  # fmt: skip
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    web = webconfig.WebConfigFile(str(config), every=0)
    with serving(loop, web=web) as port:
        context = client_context(pki)
        with pytest.raises(ssl.SSLCertVerificationError):
            get(port, context)
        for name in ("server.crt", "server.key"):  # renewed: the CA's, for 127.0.0.1
            shutil.copy(pki / name, tmp_path / name)
        wait_until(lambda: trusted(port, context), 10, "the renewed certificate")
        assert get(port, context) == 200


def trusted(port: int, context: ssl.SSLContext) -> bool:
    try:
        return get(port, context) == 200
    except ssl.SSLCertVerificationError:
        return False


def test_tls_turned_on_or_off_takes_a_restart(pki, tmp_path, caplog):
    for name in ("server.crt", "server.key"):
        shutil.copy(pki / name, tmp_path / name)
    clock = Clock()
    config = write_config(tmp_path, users_block())
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    before = web.current()
    write_config(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    clock.now += 1
    assert web.current() is before and before.tls is None
    assert "turning TLS on or off takes a restart" in caplog.text


def test_sighup_reloads_the_web_config_and_does_not_stop_serve(tmp_path):
    """SIGHUP (systemd's reload) re-reads --web.config.file at once and is logged; without
    one it is logged and harmless. `serve` answers on, and stops on SIGTERM as before."""
    config = users_config(tmp_path, alice="old")
    port = free_port()
    process = start_serve(port, "--web.config.file", str(config))
    try:
        wait_until(lambda: get(port, None, "alice", "old") == 200, 30, "serve answering")
        users_config(tmp_path, alice="new")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: get(port, None, "alice", "new") == 200, 10, "the new password")
        assert get(port, None, "alice", "old") == 401
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert "reloaded from" in stderr and "Traceback" not in stderr

    port = free_port()
    process = start_serve(port)
    try:
        wait_until(lambda: get(port, None) == 200, 30, "serve answering")
        process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert process.poll() is None and get(port, None) == 200
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert "SIGHUP: no --web.config.file to reload" in stderr and "Traceback" not in stderr


def test_the_dummy_hash_has_the_highest_cost_of_the_users():
    """An unknown user is checked at the users' highest cost: at the lowest, its answer
    would come sooner than a known user's and tell the users apart."""
    config = webconfig.WebConfig(users={
        "cheap": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)),
        "dear": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=6)),
    })  # fmt: skip
    assert max(config._dummies) == 6 and config._dummies[6].split(b"$")[2] == b"06"


def test_the_basic_scheme_is_case_insensitive():
    """RFC 9110 section 11.1: an auth scheme is case-insensitive."""
    config = webconfig.WebConfig(users={"bob": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))})
    token = base64.b64encode(b"bob:pw").decode()
    for scheme in ("Basic", "basic", "BASIC", "bAsIc"):
        assert config.authorized(f"{scheme} {token}"), scheme


def test_a_broken_file_is_read_once_and_logged_once_until_it_changes(tmp_path, caplog, monkeypatch):
    """An unchanged broken file is not read again at each look (its stamp is kept), and a
    change that breaks it the same way says nothing new; a fix is taken."""
    clock = Clock()
    users_config(tmp_path, alice="a")
    web = webconfig.WebConfigFile(str(tmp_path / "web.yml"), monotonic=clock, run=at_once)
    loads = []
    real = webconfig.load
    monkeypatch.setattr(
        webconfig, "load", lambda path, **kw: loads.append(path) or real(path, **kw)
    )
    caplog.set_level("INFO", logger="procdelta")
    broken = "basic_auth_users: [\n"
    (tmp_path / "web.yml").write_text(broken)
    for _ in range(3):
        clock.now += 1
        web.current()
    assert len(loads) == 1
    aside = tmp_path / "again"
    aside.write_text(broken)
    aside.replace(tmp_path / "web.yml")  # changed (a new inode), broken the same way
    clock.now += 1
    web.current()
    assert len(loads) == 2
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert len(caplog.records) == 1
    users_config(tmp_path, bob="b")
    clock.now += 1
    assert web.current().authorized(auth("bob", "b"))


def test_a_file_that_cannot_be_looked_at_in_a_new_way_is_read_again(tmp_path, caplog):
    """A missing file, then one that cannot be looked at for another reason (a symbolic
    link to itself): each is a change, read and said in the log once."""
    clock = Clock()
    config = users_config(tmp_path, alice="a")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    caplog.set_level("INFO", logger="procdelta")
    config.unlink()
    clock.now += 1
    good = web.current()
    config.symlink_to(config.name)  # stat(): too many levels of symbolic links
    for _ in range(2):
        clock.now += 1
        assert web.current() is good
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "No such file or directory" in said[0]
    assert "symbolic links" in said[1]


def test_the_file_is_looked_at_once_a_second_and_reread_only_when_changed(tmp_path, monkeypatch):
    """A change is taken at the first look a second or more after the last one, the
    first a second after the file was loaded; a file unchanged since it was loaded, or
    since it was last read, is not read again."""
    clock = Clock()
    path = str(users_config(tmp_path, alice="a"))
    loads = []
    real = webconfig.load
    monkeypatch.setattr(
        webconfig, "load", lambda path, **kw: loads.append(path) or real(path, **kw)
    )
    web = webconfig.WebConfigFile(path, monotonic=clock, run=at_once)
    users_config(tmp_path, bob="b")  # just after the file was loaded
    clock.now += 0.5
    assert not web.current().authorized(auth("bob", "b"))
    clock.now += 0.5
    assert web.current().authorized(auth("bob", "b"))
    users_config(tmp_path, carol="c")  # just after a look that took a change
    clock.now += 0.9
    assert not web.current().authorized(auth("carol", "c"))
    clock.now += 0.1
    assert web.current().authorized(auth("carol", "c"))
    assert len(loads) == 3
    for _ in range(3):
        clock.now += 1
        web.current()
    assert len(loads) == 3

    loads.clear()
    unchanged = webconfig.WebConfigFile(path, monotonic=clock, run=at_once)
    for _ in range(3):
        clock.now += 1
        unchanged.current()
    assert len(loads) == 1  # when it was made


@pytest.mark.parametrize("name", ["web.yml", "server.crt", "server.key", "ca.crt"])
def test_each_file_the_config_names_is_watched(pki, tmp_path, caplog, name):
    """The file itself, and cert_file, key_file and client_ca_file, are each looked at:
    any one of them replaced alone (a Secret's update renames a new file over it)
    reloads the configuration."""
    for each in ("server.crt", "server.key", "ca.crt"):
        shutil.copy(pki / each, tmp_path / each)
    config = write_config(tmp_path, TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                          "  client_ca_file: ca.crt\n")  # fmt: skip
    clock = Clock()
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    before = web.current()
    assert before.authenticates
    shutil.copy((tmp_path if name == "web.yml" else pki) / name, tmp_path / "aside")
    (tmp_path / "aside").replace(tmp_path / name)
    caplog.set_level("INFO", logger="procdelta")
    clock.now += 1
    after = web.current()
    assert after is not before and after.authenticates
    assert [r.getMessage() for r in caplog.records] == [
        f"--web.config.file reloaded from {config}: tls=True basic_auth=False users=0"
    ]


def test_a_reload_rereads_the_file_at_once_and_says_what_came_of_it(tmp_path, caplog):
    """`reload()` (SIGHUP) reads the file now, changed or not, within the second too, and
    logs each outcome: the users it took, or why the last good configuration stays."""
    clock = Clock()
    config = users_config(tmp_path, alice="a", bob="b")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    caplog.set_level("INFO", logger="procdelta")
    first = web.current()
    assert web.reload() is not first  # unchanged, read anew
    assert caplog.records[-1].getMessage() == (
        f"--web.config.file reloaded from {config}: tls=False basic_auth=True users=2"
    )
    config.write_text("basic_auth_users: [\n")
    for _ in range(2):
        good = web.current()
        assert web.reload() is good
        said = caplog.records[-1].getMessage()
        assert said.startswith("--web.config.file not reloaded, the last good one stays: ")
        assert f"{config}: not YAML: " in said
    assert len(caplog.records) == 3
    users_config(tmp_path, carol="c")
    assert web.reload().authorized(auth("carol", "c"))
    assert caplog.records[-1].getMessage().endswith("tls=False basic_auth=True users=1")


def test_a_password_may_hold_colons_and_a_token_only_base64(tmp_path):
    """RFC 7617: the user ends at the first colon, the password may hold more. A token
    with a character outside base64 is refused, as Go's decoder refuses it, not read
    with that character dropped."""
    config = webconfig.WebConfig(users={"bob": bcrypt.hashpw(b"a:b:c", bcrypt.gensalt(4))})
    assert config.authorized(auth("bob", "a:b:c"))
    token = base64.b64encode(b"bob:a:b:c").decode()
    assert not config.authorized(f"Basic {token[:4]}!{token[4:]}")
    assert not config.authorized(f"Basic {token[:4]}\n{token[4:]}")
    assert config.authorized(f"Basic {token}")


def test_a_web_config_in_utf_16_loads_as_yaml_allows(tmp_path):
    """YAML may come in UTF-16 with its byte order mark (go-yaml, which exporter-toolkit
    uses, reads it too): the file is read as bytes, its encoding YAML's to find."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_bytes(f"basic_auth_users:\n  bob: '{hashed}'\n".encode("utf-16"))
    assert webconfig.load(str(path)).authorized(auth("bob", "pw"))


def test_a_password_bcrypt_refuses_is_a_refusal_not_a_login(monkeypatch):
    """bcrypt 4 raises for a password with a NUL byte (5 accepts it): such a password is
    refused like a wrong one, and nothing of it is remembered."""
    config = webconfig.WebConfig(users={"bob": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))})

    def refuse(password: bytes, hashed: bytes) -> bool:
        raise ValueError("password may not contain NUL bytes")

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", refuse)
    header = auth("bob", "p\x00w")
    assert not config.authorized(header)
    assert config.remembered(header) is None


# -- a re-read never turns protection off, and never holds the event loop ---------------------


@pytest.mark.parametrize(
    "text",
    ["", "# rotated: users to come\n", "basic_auth_users:\n", "basic_auth_users: {}\n", "{}\n"],
    ids=["empty", "comments", "null users", "no users", "empty mapping"],
)
def test_a_file_emptied_of_its_users_keeps_basic_auth_on_and_stays_watched(tmp_path, caplog, text):
    """An in-place save, a two-step write, a full disk or a Secret briefly empty load to
    no users: a file that no longer loads. The users in force stay (said at warning), the
    file is still looked at, and the users written back are taken."""
    clock = Clock()
    config = users_config(tmp_path, alice="a")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    good = web.current()
    config.write_text(text)
    for _ in range(3):
        clock.now += 1
        assert web.current() is good
        assert not web.current().authorized(None)
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert "no basic_auth_users: turning basic auth off takes a restart" in record.getMessage()
    users_config(tmp_path, bob="b")
    clock.now += 1
    assert web.current().authorized(auth("bob", "b"))
    assert not web.current().authorized(auth("alice", "a"))


def test_a_file_empty_at_start_up_is_watched_and_may_turn_auth_on(tmp_path):
    """An empty file at start-up serves without auth (said in the start line), and is
    looked at all the same: users written to it later are taken."""
    clock = Clock()
    config = tmp_path / "web.yml"
    config.write_text("")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    assert web.current().authorized(None)
    users_config(tmp_path, alice="a")
    clock.now += 1
    assert not web.current().authorized(None)
    assert web.current().authorized(auth("alice", "a"))


def test_client_certificates_verified_stay_verified_across_a_reread(pki, tmp_path, caplog):
    """A file that stops verifying client certificates (another client_auth_type, or none)
    is refused like one that removes the users; another CA is taken."""
    for name in ("server.crt", "server.key", "ca.crt", "stranger.crt"):
        shutil.copy(pki / name, tmp_path / name)
    verify = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n"
    clock = Clock()
    config = write_config(tmp_path, verify.format("ca.crt"))
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    good = web.current()
    for weaker in ("VerifyClientCertIfGiven", "RequireAnyClientCert", "NoClientCert"):
        write_config(tmp_path, TLS + f"  client_auth_type: {weaker}\n  client_ca_file: ca.crt\n")
        clock.now += 1
        assert web.current() is good, weaker
        assert "turning client certificate verification off takes a restart" in caplog.text
    write_config(tmp_path, verify.format("stranger.crt"))
    clock.now += 1
    assert web.current() is not good and web.current().verifies_clients


def test_credentials_remembered_survive_a_reread_for_users_whose_hash_is_the_same(tmp_path):
    """A re-read (a renewed certificate, a Secret synced, SIGHUP) keeps what was verified
    of each user whose hash did not change, so that scrapers are not sent back to bcrypt
    behind a flood of wrong passwords; a changed hash forgets its user's."""
    clock = Clock()
    hashed = {u: bcrypt.hashpw(u.encode(), bcrypt.gensalt(rounds=4)).decode() for u in "ab"}
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed['a']}'\n  bob: '{hashed['b']}'\n")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    assert web.current().authorized(auth("alice", "a")) and web.current().authorized(
        auth("bob", "b")
    )
    before = web.current()
    assert web.reload() is not before  # read anew, the same users
    assert web.current().remembered(auth("alice", "a")) is True
    assert web.current().remembered(auth("bob", "b")) is True
    bob = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=4)).decode()  # the same password, rehashed
    config.write_text(f"basic_auth_users:\n  alice: '{hashed['a']}'\n  bob: '{bob}'\n")
    web.reload()
    assert web.current().remembered(auth("alice", "a")) is True
    assert web.current().remembered(auth("bob", "b")) is None  # to be checked again


def test_a_reread_runs_off_the_thread_that_asks_and_is_swapped_in_when_done(tmp_path, monkeypatch):
    """`current()` (the event loop's, at a request) and `reload()` (SIGHUP's) return at
    once while a re-read takes its time in a thread of its own; the new configuration
    serves once it is whole. Re-reads asked meanwhile are done once, after it."""
    config = users_config(tmp_path, alice="a")
    web = webconfig.WebConfigFile(str(config), every=0)
    started, release = threading.Event(), threading.Event()
    loads = []
    real = webconfig.load

    def slow(path, **kw):
        loads.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return real(path, **kw)

    monkeypatch.setattr(webconfig, "load", slow)
    users_config(tmp_path, bob="b")
    began = time.monotonic()
    before = web.current()  # sees the change, starts the re-read
    for _ in range(50):
        assert web.reload() is before
        assert web.current() is before
    assert time.monotonic() - began < 1
    assert started.wait(5)
    release.set()
    wait_until(lambda: web.current().authorized(auth("bob", "b")), 10, "the new users")
    wait_until(lambda: len(loads) == 2, 10, "the one re-read asked meanwhile")
    time.sleep(0.3)
    assert loads == ["web-config", "web-config"]


def hash_of_cost(cost: int) -> str:
    """A well-formed bcrypt hash of `cost` made without paying for it: a cost-4 hash with
    the cost field rewritten (what bcrypt reads of it before its work)."""
    cheap = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=4)).decode()
    return f"{cheap[:4]}{cost:02d}{cheap[6:]}"


@pytest.mark.parametrize("cost", [15, 31])
def test_a_bcrypt_cost_above_the_bound_is_one_clear_line_at_start_up(tmp_path, cost):
    """A cost-31 hash would take days a check: at start-up it is refused at once, with
    the bound, rather than hanging `serve` silently."""
    config = write_config(tmp_path, f"basic_auth_users:\n  alice: '{hash_of_cost(cost)}'\n")
    result = subprocess.run(
        [sys.executable, "-m", "collector", "serve", "--web.listen-address", "127.0.0.1:0",
         "--web.config.file", str(config)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert_one_line_error(result, "--web.config.file", f"bcrypt cost {cost} is above 14")


def test_a_bcrypt_cost_above_the_bound_at_a_reread_keeps_the_last_good(tmp_path, caplog):
    clock = Clock()
    config = users_config(tmp_path, alice="a")
    web = webconfig.WebConfigFile(str(config), monotonic=clock, run=at_once)
    good = web.current()
    config.write_text(f"basic_auth_users:\n  alice: '{hash_of_cost(31)}'\n")
    began = time.monotonic()
    clock.now += 1
    assert web.current() is good
    assert time.monotonic() - began < 2
    assert "bcrypt cost 31 is above 14" in caplog.text
    assert webconfig.load(str(users_config(tmp_path, a="a")))  # cost 4: taken
    config.write_text(f"basic_auth_users:\n  alice: '{hash_of_cost(webconfig.MAX_BCRYPT_COST)}'\n")
    assert webconfig.load(str(config)).users["alice"][4:6] == b"14"


@pytest.mark.parametrize("name", ["web.yml", "server.crt", "server.key", "ca.crt"])
def test_only_regular_files_are_read(pki, tmp_path, name):
    """A FIFO (or a device) named as the file or one it names would block the read that
    loads it, for ever: it is refused at once, as not a regular file."""
    for each in ("server.crt", "server.key", "ca.crt"):
        shutil.copy(pki / each, tmp_path / each)
    text = TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n"
    config = write_config(tmp_path, text)
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    began = time.monotonic()
    with pytest.raises(webconfig.WebConfigError, match="not a regular file"):
        webconfig.load(str(config))
    assert time.monotonic() - began < 5


def test_a_file_past_its_size_bound_is_refused(tmp_path):
    config = write_config(tmp_path, "# " + "x" * webconfig.MAX_FILE_BYTES + "\n")
    with pytest.raises(webconfig.WebConfigError, match="larger than"):
        webconfig.load(str(config))


def test_every_check_costs_a_check_at_the_highest_cost(monkeypatch):
    """With users of costs 4 and 6, a check of either user, right or wrong, and of an
    unknown user costs 2^6 rounds: the time of a 401 tells nothing of who exists."""
    config = webconfig.WebConfig(users={
        "cheap": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)),
        "dear": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=6)),
    })  # fmt: skip
    costs: list[int] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        costs.append(int(hashed[4:6]))
        return real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", counted)
    for user, password in (("cheap", "a"), ("cheap", "no"), ("dear", "b"), ("dear", "no"),
                           ("nobody", "a")):  # fmt: skip
        costs.clear()
        config._verified.clear()
        config.authorized(auth(user, password))
        assert sum(2**cost for cost in costs) == 2**6, (user, password, costs)


def test_an_empty_web_config_file_option_is_one_clear_line(tmp_path):
    """`PROCDELTA_WEB_CONFIG_FILE=` (a variable set empty in a manifest) would serve
    without auth, in silence: it is refused like any other bad value."""
    result = subprocess.run(
        [sys.executable, "-m", "collector", "serve", "--web.listen-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PROCDELTA_WEB_CONFIG_FILE": ""},
    )  # fmt: skip
    assert_one_line_error(result, "PROCDELTA_WEB_CONFIG_FILE", "empty")


# -- each request under its own connection's terms --------------------------------------------


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


def test_a_connection_made_under_changed_tls_terms_is_closed_once_idle(pki, tmp_path):
    """A move from basic auth alone to basic auth with verified client certificates: a
    connection kept alive from before, with no certificate, is closed, not served under
    the new terms; a new one must present a certificate."""
    tls_dir(pki, tmp_path)
    config = write_config(tmp_path, TLS + users_block())
    web = webconfig.WebConfigFile(str(config), every=0)
    with serving_config_file(web) as port, kept_alive(port, client_context(pki)) as old:
        assert ask(old) == b"HTTP/1.1 200 OK"
        write_config(tmp_path, TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                     "  client_ca_file: ca.crt\n" + users_block())  # fmt: skip
        certified = client_context(pki, with_cert=True)
        swapped_in(web, port, certified, lambda config: config.verifies_clients)
        wait_until(lambda: server_closed(old), 10, "the old connection closed")
        assert get(port, certified, "alice") == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            get(port, client_context(pki), "alice")


def test_a_request_on_a_connection_made_under_old_terms_is_not_answered(pki, tmp_path):
    """The client's CA dropped from client_ca_file: its kept-alive connection is closed
    unanswered at its next request, even one sent before the idle ones are swept."""
    tls_dir(pki, tmp_path)
    verify = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n"
    config = write_config(tmp_path, verify.format("ca.crt") + users_block())
    web = webconfig.WebConfigFile(str(config), every=0)
    listener_of: list = []
    with (
        serving_config_file(web, listener_of) as port,
        kept_alive(port, client_context(pki, with_cert=True)) as old,
    ):
        assert ask(old) == b"HTTP/1.1 200 OK"
        listener_of[0].terms_changed = lambda: None  # no sweep: the request must tell
        write_config(tmp_path, verify.format("stranger.crt") + users_block())
        swapped_in(
            web, port, client_context(pki, with_cert="stranger"),
            lambda config: config.tls.terms != listener_of[0].tls_at_start,
        )  # fmt: skip
        assert ask(old) == b""


def test_a_certificate_counts_where_this_connections_handshake_verified_one(pki, tmp_path):
    """With VerifyClientCertIfGiven and no users, a connection whose certificate was
    verified is authenticated (a process's storage bytes are its to see), one without a
    certificate is not."""
    tls_dir(pki, tmp_path)
    config = write_config(tmp_path, TLS + "  client_auth_type: VerifyClientCertIfGiven\n"
                          "  client_ca_file: ca.crt\n")  # fmt: skip
    web = webconfig.WebConfigFile(str(config), every=0)
    with serving_config_file(web) as port:
        path = "/processes?sort=read_bytes"
        assert request(port, path, context=client_context(pki, with_cert=True))[0] == 200
        assert request(port, path, context=client_context(pki))[0] == 403


@contextlib.contextmanager
def serving_config_file(web: webconfig.WebConfigFile, listener_of: list | None = None):
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics", web)
    if listener_of is not None:
        server.listener.tls_at_start = web.current().tls.terms
        listener_of.append(server.listener)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_clients_without_credentials_hold_no_place_of_the_scrapes(tmp_path):
    """Clients without credentials that pipeline requests and never read their answers
    (20 of them against --web.max-requests 2, each pipeline's 401s far more than the
    buffers hold): each gets one 401 and its connection closed, holding no place; a scrape
    with the password is answered."""
    config = users_config(tmp_path, alice=PASSWORD)
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    web = webconfig.WebConfigFile(str(config))
    server = make_server("127.0.0.1:0", loop, "/metrics", web, Limits(max_requests=2))
    server.listener.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    port = server.server_address[1]
    hostile: list[socket.socket] = []

    def flood(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 20_000)

    try:
        assert get(port, None, "alice") == 200
        for _ in range(20):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            hostile.append(sock)
            threading.Thread(target=flood, args=(sock,), daemon=True).start()
        time.sleep(1)
        assert [get(port, None, "alice") for _ in range(5)] == [200] * 5
    finally:
        for sock in hostile:
            sock.close()
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_sighup_storm_rereads_the_file_once_a_second(tmp_path):
    """200 SIGHUPs in a second: the file is re-read once at the first and once for the
    rest, a second later (each re-read is a line in the log and a bcrypt-hashed file
    parsed), and serve answers throughout."""
    config = users_config(tmp_path, alice="a")
    port = free_port()
    process = start_serve(port, "--web.config.file", str(config))
    try:
        wait_until(lambda: get(port, None, "alice", "a") == 200, 30, "serve answering")
        for _ in range(200):
            process.send_signal(signal.SIGHUP)
            time.sleep(0.005)
        assert get(port, None, "alice", "a") == 200
        time.sleep(2)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    assert 1 <= stderr.count("reloaded from") <= 3, stderr.count("reloaded from")

"""TLS as the official exporters serve it (`--web.config.file`'s `tls_server_config`, against
a real `procdelta serve`, with certificates made by openssl): client certificates in each
mode, the versions' bounds, the handshake's deadline, a certificate renewed in place, and a
connection made under terms since changed."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import socket
import ssl
import subprocess
import sys

import pytest

from collector import webconfig
from collector.admission import Limits
from collector.passloop import PassLoop
from tests.integration.test_serve import CountingEngine, serving
from tests.net import request, wait_until
from tests.webconfigs import (
    TLS,
    Clock,
    admitted,
    ask,
    at_once,
    client_context,
    get,
    kept_alive,
    only,
    server_closed,
    serving_config,
    serving_config_file,
    start,
    swapped_in,
    tls_dir,
    trusted,
    users_block,
    write_config,
)


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

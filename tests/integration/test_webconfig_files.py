"""The file `--web.config.file` names: a bad one is one clear line at start-up; it is watched
while `serve` runs and re-read when it changes or on SIGHUP, off the thread that asks, once
a second at most; a file that no longer loads, or loads to no users where there were users,
keeps the last good configuration; only regular files within a size bound are read."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import bcrypt
import pytest

from collector import webconfig
from tests.integration.test_cli import assert_one_line_error
from tests.net import free_port, start_serve, wait_until
from tests.webconfigs import (
    TLS,
    Clock,
    at_once,
    auth,
    get,
    hash_of_cost,
    users_config,
    write_config,
)


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


def test_a_web_config_in_utf_16_loads_as_yaml_allows(tmp_path):
    """YAML may come in UTF-16 with its byte order mark (go-yaml, which exporter-toolkit
    uses, reads it too): the file is read as bytes, its encoding YAML's to find."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_bytes(f"basic_auth_users:\n  bob: '{hashed}'\n".encode("utf-16"))
    assert webconfig.load(str(path)).authorized(auth("bob", "pw"))


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


def test_an_empty_web_config_file_option_is_one_clear_line(tmp_path):
    """`PROCDELTA_WEB_CONFIG_FILE=` (a variable set empty in a manifest) would serve
    without auth, in silence: it is refused like any other bad value."""
    result = subprocess.run(
        [sys.executable, "-m", "collector", "serve", "--web.listen-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PROCDELTA_WEB_CONFIG_FILE": ""},
    )  # fmt: skip
    assert_one_line_error(result, "PROCDELTA_WEB_CONFIG_FILE", "empty")


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

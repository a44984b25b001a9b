"""bcrypt basic auth as the official exporters check it (`--web.config.file`'s
`basic_auth_users`): a check's cost tells no user apart, checks run one at a time,
credentials verified are remembered, and clients without credentials hold no place of the
scrapes."""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import time

import bcrypt

from collector import webconfig
from collector.admission import Limits
from collector.exporter import make_server
from collector.passloop import PassLoop
from tests.integration.test_serve import CountingEngine
from tests.net import request, wait_until
from tests.webconfigs import (
    PASSWORD,
    Clock,
    at_once,
    auth,
    get,
    start,
    users_block,
    users_config,
    write_config,
)


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

"""`serve`: snapshots swapped atomically, scrapes that never wait, health, signals, bad input."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from types import MappingProxyType

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from collector.engine import PassResult
from collector.exporter import MetricsServer, make_server, parse_listen_address, wants_openmetrics
from collector.groups import Group
from collector.model import COUNTER_FIELD_NAMES, FIELD_NAMES, Fields
from collector.passloop import PassLoop
from collector.sources import online_cpus
from tests.fixturetree import PASS1
from tests.integration.test_cli import assert_one_line_error
from tests.net import free_port, request, start_serve, wait_until
from tests.promtools import check_metrics


class CountingEngine:
    """An engine whose pass N reports the value N in every series of 50 groups."""

    def __init__(self, groups: int = 50):
        self.passes = 0
        self.groups = [Group("cgroup", (("cgroup", f"/g{i}"),)) for i in range(groups)]

    def run_pass(self) -> PassResult:
        self.passes += 1
        n = self.passes
        fields = Fields(**{name: n for name in FIELD_NAMES})
        return PassResult(
            number=n,
            listed_at_ns=n,
            interval_ns=1,
            duration_seconds=0.001,
            finished_at=1.0,
            intervals=MappingProxyType(dict.fromkeys(self.groups, fields)),
            footprints=MappingProxyType({}),
            totals=MappingProxyType(
                {g: dict.fromkeys(COUNTER_FIELD_NAMES, n) for g in self.groups}
            ),
            dropped=MappingProxyType({"first_seen": 0}),
            dropped_threads=MappingProxyType({}),
            tracked_processes=n,
            tracked_threads=n,
            denied=0,
        )


@contextlib.contextmanager
def serving(
    loop: PassLoop,
    path: str = "/metrics",
    web=None,
    limits=None,
    storage_bytes=False,
    before: Callable[[MetricsServer], None] | None = None,
) -> Iterator[int]:
    """An in-process server of `loop` on 127.0.0.1 (with a web configuration and the
    listener's limits, if given; `storage_bytes`: --web.processes.storage-bytes): its port.
    `before`: called with the server made, before it serves."""
    server = make_server("127.0.0.1:0", loop, path, web, limits, storage_bytes=storage_bytes)
    if before is not None:
        before(server)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# Every series of these families equals N on the page of CountingEngine's pass N.
PASS_NUMBERED = (
    {f"procdelta_interval_{name}" for name in FIELD_NAMES}
    | {f"procdelta_{name}" for name in COUNTER_FIELD_NAMES}
    | {"procdelta_passes", "procdelta_tracked_processes", "procdelta_tracked_threads"}
)


def test_every_scrape_is_one_consistent_snapshot_while_passes_run():
    loop = PassLoop(CountingEngine(), interval=0.005)
    loop.start()
    failures: list[str] = []
    seen_passes: set[int] = set()

    def scraper() -> None:
        for _ in range(60):
            status, _, body = request(port, "/metrics")
            if status != 200:
                failures.append(f"status {status}")
                continue
            values = {
                sample.value
                for family in parse_text(body.decode())
                if family.name in PASS_NUMBERED
                for sample in family.samples
            }
            if len(values) != 1:
                failures.append(f"mixed passes in one scrape: {sorted(values)[:5]}")
            seen_passes.update(values)

    try:
        with serving(loop) as port:
            threads = [threading.Thread(target=scraper) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
    finally:
        loop.stop()
    assert failures == []
    assert len(seen_passes) > 5, "passes ran while the scrapes did"


def test_a_scrape_never_advances_the_cache():
    engine = CountingEngine()
    loop = PassLoop(engine, interval=60)
    loop.run_pass()
    with serving(loop) as port:
        for _ in range(5):
            assert request(port, "/metrics")[0] == 200
    assert engine.passes == 1


def test_content_negotiation_gzip_and_routes():
    loop = PassLoop(CountingEngine(groups=3), interval=60)
    loop.run_pass()
    with serving(loop, "/custom") as port:
        status, headers, body = request(port, "/custom")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        result = check_metrics(body)
        assert result.returncode == 0, result.stdout + result.stderr
        status, headers, body = request(
            port, "/custom", {"Accept": "application/openmetrics-text;version=1.0.0,*/*;q=0.1"}
        )
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
        status, headers, body = request(port, "/custom", {"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip"
        plain = gzip.decompress(body)
        assert b"procdelta_passes_total 1" in plain and b"process_cpu_seconds_total" in plain
        assert request(port, "/")[0] == 200 and b'href="/custom"' in request(port, "/")[2]
        assert request(port, "/metrics")[0] == 404
        assert request(port, "/healthz")[0] == 200


def test_health_follows_the_passes():
    now = [100.0]
    loop = PassLoop(CountingEngine(groups=1), interval=10, monotonic=lambda: now[0])
    assert loop.healthy()[0] is False  # no pass yet
    loop.run_pass()
    assert loop.healthy()[0] is True
    now[0] += 29
    assert loop.healthy()[0] is True
    now[0] += 2  # older than three intervals
    ok, reason = loop.healthy()
    assert ok is False and "ago" in reason


class FailingEngine(CountingEngine):
    def run_pass(self) -> PassResult:
        if self.passes == 1:
            self.passes += 1
            raise OSError("proc vanished")
        return super().run_pass()


def test_failed_passes_do_not_keep_health_green():
    """/healthz ages from the last pass that completed: passes that fail, however many,
    leave it to turn red after three intervals, so that kubelet restarts the pod."""
    now = [100.0]

    class AlwaysFailing(CountingEngine):
        def run_pass(self) -> PassResult:
            if self.passes >= 1:
                raise OSError("proc vanished")
            return super().run_pass()

    loop = PassLoop(AlwaysFailing(groups=1), interval=10, monotonic=lambda: now[0])
    loop.run_pass()
    for _ in range(4):
        now[0] += 10
        assert loop.run_pass() is None
    ok, reason = loop.healthy()
    assert ok is False and "40.0s ago" in reason


def test_a_failed_pass_is_counted_and_keeps_the_last_page():
    loop = PassLoop(FailingEngine(groups=1), interval=10)
    loop.run_pass()
    assert loop.run_pass() is None
    page = loop.snapshot().text
    assert b"procdelta_failed_passes_total 1" in page
    assert b'procdelta_interval_processes{cgroup="/g0"} 1' in page
    loop.run_pass()
    assert b"procdelta_passes_total 2" in loop.snapshot().text


@pytest.mark.parametrize(
    ("address", "parsed"),
    [(":9746", ("", 9746)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
)
def test_listen_address_forms(address, parsed):
    assert parse_listen_address(address) == parsed


def test_wants_openmetrics():
    assert wants_openmetrics("application/openmetrics-text; version=1.0.0")
    assert not wants_openmetrics("text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert not wants_openmetrics(None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_it_cleanly(signum):
    """A signal ends serve with status 0 and its "stopping" line, the listener closed (no
    bound on how long: a loaded machine may delay it; the wait below only guards against
    a hang)."""
    port = free_port()
    process = start_serve(port, interval="0.5")
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 20, "healthy")
        process.send_signal(signum)
        process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and "starting procdelta" in stderr
    assert "stopping" in stderr
    with pytest.raises(OSError):
        request(port, "/healthz")


def test_a_stop_that_hangs_is_said_with_every_threads_stack_and_ends():
    """Past STOP_SECONDS of stopping, serve says so at error level, dumps every thread's
    stack (what held it) and exits 1, rather than hang until the kubelet kills it."""
    code = (
        "import threading, time\n"
        "from collector import logs, serving\n"
        "logs.configure('info', 'logfmt')\n"
        "serving.STOP_SECONDS = 0.2\n"
        "t = threading.Timer(serving.STOP_SECONDS, serving._stuck_stopping)\n"
        "t.start()\n"
        "time.sleep(30)  # a stop that never ends\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 1
    assert "level=error" in result.stderr and "stopping took over" in result.stderr
    assert "time.sleep(30)" in result.stderr or "<string>" in result.stderr  # the stacks


def run_serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector", "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_listen_address_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_serve("--web.listen-address", f"127.0.0.1:{port}")
    assert_one_line_error(result, "--web.listen-address", "in use", status=1)


@pytest.mark.parametrize(
    "address",
    [
        "9746",
        "localhost",
        ":http",
        "[::1",
        "1.2.3.4:99999",
        "a:b:c",
        ":\u0661\u0662",
        "[::1]:\uff19",
    ],
)
def test_listen_address_malformed(address):
    assert_one_line_error(run_serve("--web.listen-address", address), "--web.listen-address")


def test_listen_address_unresolvable():
    result = run_serve("--web.listen-address", "no-such-host.invalid:9746")
    assert_one_line_error(result, "--web.listen-address")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--interval", "0"], ["--interval"]),
        (["--interval", "-1"], ["--interval"]),
        (["--path.procfs", "/etc"], ["--path.procfs", "not a proc filesystem"]),
        (["--path.procfs", os.path.join(str(PASS1), "100", "stat")], ["--path.procfs"]),
        (["--web.telemetry-path", "metrics"], ["--web.telemetry-path"]),
    ],
)
def test_bad_input_one_line(args, words):
    assert_one_line_error(run_serve("--web.listen-address", "127.0.0.1:0", *args), *words)


def test_the_node_cpus_are_procdeltas_own_count(tmp_path):
    """`procdelta_node_cpus`: the online CPUs of `<procfs>/stat` (one `cpu<N>` line each),
    what psutil counts on this machine, read after every pass; no series where it cannot
    be read."""
    assert online_cpus("/proc") == psutil.cpu_count(logical=True)
    (tmp_path / "stat").write_text(
        "cpu  1 2 3 4\ncpu0 1 2 3 4\ncpu1 1 2 3 4\ncpu3 1 2 3 4\nintr 5 cpu9\nctxt 7\n"
    )
    assert online_cpus(str(tmp_path)) == 3  # cpu2 offline
    assert online_cpus(str(tmp_path / "nowhere")) is None
    counts = iter([4, 6])
    loop = PassLoop(CountingEngine(), interval=60, cpus=lambda: next(counts))
    assert b"procdelta_node_cpus" not in loop.snapshot().text  # before a pass
    for expected in (4, 6):
        loop.run_pass()
        assert f"\nprocdelta_node_cpus {expected}\n".encode() in loop.snapshot().text

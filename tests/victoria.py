"""A throwaway VictoriaMetrics stack on loopback, from Debian's `victoria-metrics` package:
the single-node server, vmagent scraping procdelta into it, and vmalert evaluating a rule
file against it (its records written back, its alerts sent to a notifier that drops them).
Each binary is required: a missing one fails the test that needs it, it does not skip."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from tests.net import free_port, http_get, stop_process, wait_until
from tests.promtools import binary


class _Drop(http.server.BaseHTTPRequestHandler):
    """Alertmanager's API as vmalert posts to it: every notification taken, none kept."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class Victoria:
    """The running stack: `query` asks the server (MetricsQL), `alerts` vmalert."""

    def __init__(self, server: int, vmalert: int):
        self.server, self.vmalert = server, vmalert

    def query(self, metricsql: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.server}/api/v1/query?"
        answer = json.loads(http_get(url + urllib.parse.urlencode({"query": metricsql})))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def alerts(self) -> list[dict]:
        """vmalert's alerts, pending and firing, each with `labels` and `annotations`."""
        answer = json.loads(http_get(f"http://127.0.0.1:{self.vmalert}/api/v1/alerts"))
        return answer["data"]["alerts"] or []  # null while there is none


@contextlib.contextmanager
def victoria(
    directory: Path, targets: list[str], rules: Path, labels: dict[str, str]
) -> Iterator[Victoria]:
    """VictoriaMetrics, vmagent scraping `targets` every second (with `labels`, as the
    monitors set `node`), vmalert evaluating `rules` every second."""
    ports = {name: free_port() for name in ("server", "agent", "vmalert")}
    notifier = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Drop)
    threading.Thread(target=notifier.serve_forever, daemon=True).start()
    scrape = directory / "scrape.yml"
    scrape.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: procdelta\n"
        f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
        f"        labels: {json.dumps(labels)}\n"
    )
    server = f"http://127.0.0.1:{ports['server']}"
    commands = {
        "victoria-metrics": [
            binary("victoria-metrics", "victoria-metrics"),
            f"-storageDataPath={directory / 'data'}",
            f"-httpListenAddr=127.0.0.1:{ports['server']}",
            "-search.latencyOffset=0s",  # the last second's samples: a test is short
            "-search.disableCache",
        ],
        "vmagent": [
            binary("vmagent", "victoria-metrics"),
            f"-promscrape.config={scrape}",
            f"-remoteWrite.url={server}/api/v1/write",
            f"-remoteWrite.tmpDataPath={directory / 'agent'}",
            f"-httpListenAddr=127.0.0.1:{ports['agent']}",
        ],
        "vmalert": [
            binary("vmalert", "victoria-metrics"),
            f"-rule={rules}",
            f"-datasource.url={server}",
            f"-remoteWrite.url={server}",
            f"-remoteRead.url={server}",
            f"-notifier.url=http://127.0.0.1:{notifier.server_address[1]}",
            "-evaluationInterval=1s",
            f"-httpListenAddr=127.0.0.1:{ports['vmalert']}",
        ],
    }
    processes: list[tuple[subprocess.Popen, object]] = []
    try:
        for name, command in commands.items():
            log = open(directory / f"{name}.log", "w")  # noqa: SIM115 - closed below
            processes.append((subprocess.Popen(command, stdout=log, stderr=log), log))
            port = ports[{"victoria-metrics": "server", "vmagent": "agent"}.get(name, name)]
            wait_until(lambda p=port: http_get(f"http://127.0.0.1:{p}/health"), 60, f"{name} up")
        yield Victoria(ports["server"], ports["vmalert"])
    finally:
        for process, log in reversed(processes):
            stop_process(process)
            log.close()
        notifier.shutdown()
        notifier.server_close()

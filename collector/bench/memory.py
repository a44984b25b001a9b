"""The resident memory of a real `procdelta serve` over a synthetic table (`serve_rss`)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil

from collector.bench.loopback import fetch, free_port
from collector.bench.tables import pid_room, synthetic_table


def serve_rss(processes: int, passes: int = 4) -> float:
    """RSS (MB) of a real `procdelta serve` after some passes over a synthetic table."""
    with pid_room(processes * 3), synthetic_table(processes, "idle"):
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--interval", "0.5",
             "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error"],
        )  # fmt: skip
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                with contextlib.suppress(OSError):
                    page = fetch(port)
                    count = [
                        line
                        for line in page.split(b"\n")
                        if line.startswith(b"procdelta_passes_total")
                    ]
                    if count and int(count[0].split()[1]) >= passes:
                        break
                time.sleep(0.2)
            return psutil.Process(server.pid).memory_info().rss / 1e6
        finally:
            server.terminate()
            server.wait()

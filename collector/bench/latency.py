"""The latency of `/metrics` with many groups while passes run (`metrics_latency`), over
an engine that makes up its groups (`SyntheticEngine`): the server and the pass loop of
`procdelta serve` in this process, no `/proc` read.
"""

from __future__ import annotations

import http.client
import sys
import time
from types import MappingProxyType

from collector.engine import PassResult
from collector.groups import Group
from collector.model import COUNTER_FIELD_NAMES, FIELD_NAMES, Fields


class SyntheticEngine:
    """An engine that reports `groups` pod groups every pass, for the /metrics latency test."""

    def __init__(self, groups: int):
        self.groups = [
            Group("pod", (("namespace", f"ns{i % 20}"), ("pod", f"pod-{i}"),
                          ("uid", f"{i:08d}-0000-4000-8000-000000000000"), ("qos", "burstable")))
            for i in range(groups)
        ]  # fmt: skip
        self.passes = 0

    def run_pass(self) -> PassResult:
        self.passes += 1
        fields = Fields(**{name: 10**9 + self.passes for name in FIELD_NAMES})
        totals = {g: dict.fromkeys(COUNTER_FIELD_NAMES, 10**12 + self.passes) for g in self.groups}
        return PassResult(
            number=self.passes, listed_at_ns=0, interval_ns=10**9, duration_seconds=0.01,
            finished_at=time.time(), intervals=MappingProxyType(dict.fromkeys(self.groups, fields)),
            footprints=MappingProxyType({}), totals=MappingProxyType(totals),
            dropped=MappingProxyType({}), dropped_threads=MappingProxyType({}), tracked_processes=0,
            tracked_threads=0, denied=0,
        )  # fmt: skip


def metrics_latency(groups: int = 1000, scrapes: int = 300, interval: float = 0.25) -> list[float]:
    """Latency (ms) of scrapes of /metrics with `groups` groups while passes run."""
    import threading

    from collector.exporter import make_server
    from collector.passloop import PassLoop

    sys.setswitchinterval(0.001)  # as `procdelta serve` sets it
    loop = PassLoop(SyntheticEngine(groups), interval)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics")
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    loop.start()
    port = server.server_address[1]
    latencies = []
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(scrapes):
            began = time.perf_counter()
            connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            connection.getresponse().read()
            latencies.append((time.perf_counter() - began) * 1000)
        connection.close()
    finally:
        loop.stop()
        server.shutdown()
        server.server_close()
    return latencies

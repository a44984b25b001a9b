"""What a flood of `/processes` does to scrapes of `/metrics` (docs/deploy.md, "What the
listener withstands"): a real `procdelta serve` on 127.0.0.1 with a node's worth of
processes (this machine's, and `--sleepers` more), its `/metrics` scraped one at a time,
at rest and while `--clients` clients ask `/processes?limit=0` back to back, the two
phases alternated `--rounds` times; the p50 and p99 of the scrapes in each phase and their
ratios, flood against rest, in the same run. The clients run at `--nice` 19 by default:
they stand for clients on other machines, so that what is measured is what serving them
takes from the scrapes, not what reading the answers takes from the node's two cores
(`--nice 0` counts that too). Every process it starts is stopped when it ends, also on an
error or a signal. Not part of the tests: it takes a few minutes, and prints numbers.

    python -m tests.tools.viewflood --sleepers 2000 --clients 8 --scrapes 400
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.net import free_port, start_serve, stop_process, wait_until

FLOOD = """
import http.client, signal, sys
port, counter, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
answered = 0
def done(*_):
    open(counter, "w").write(str(answered))
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    answered += response.status == 200
    connection.close()
"""
"""One client: `/processes?limit=0` back to back until SIGTERM, then the count of its
answers written to a file."""


def get(port: int, path: str) -> tuple[int, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, len(response.read())
    finally:
        connection.close()


def scrapes(port: int, count: int) -> list[float]:
    """`count` scrapes one after the other, each one's seconds."""
    took = []
    for _ in range(count):
        started = time.perf_counter()
        status, _ = get(port, "/metrics")
        took.append(time.perf_counter() - started)
        assert status == 200, status
        time.sleep(0.01)
    return took


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100)
    return statistics.median(samples), cuts[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleepers", type=int, default=2000, help="processes added")
    parser.add_argument("--clients", type=int, default=8, help="clients asking /processes")
    parser.add_argument("--scrapes", type=int, default=400, help="scrapes per phase")
    parser.add_argument("--rounds", type=int, default=3, help="rest and flood phases, alternated")
    parser.add_argument(
        "--interval",
        default="15",
        help="serve's --interval (its default): a view is made once a pass; 1, every second",
    )
    parser.add_argument(
        "--path", default="/processes?limit=0", help="what the clients ask (/nothing: a 404 flood)"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=19,
        help="the clients' niceness: 19 stands for clients on other machines, whose reading "
        "takes no CPU from the node (0: theirs counts, as on a node that runs them)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with contextlib.ExitStack() as stack:
        sleepers = []
        for _ in range(args.sleepers):
            sleeper = subprocess.Popen(["sleep", "3600"])
            sleepers.append(sleeper)
            stack.callback(sleeper.kill)
        port = free_port()
        serve = start_serve(port, interval=args.interval)
        stack.callback(stop_process, serve)
        wait_until(lambda: get(port, "/processes?limit=0")[1] > 1000, 60, "a view to answer")
        time.sleep(3)
        _, size = get(port, "/processes?limit=0")
        counter = stack.enter_context(tempfile.TemporaryDirectory(prefix="viewflood-"))
        rest, flooded, answered, seconds = [], [], 0, 0.0
        for round_ in range(args.rounds):  # alternated: a drift of the machine hits both
            rest += scrapes(port, args.scrapes)
            # each client a process of its own: in this one, their reading would take the
            # interpreter from the scrapes measured here
            clients = []
            for index in range(args.clients):
                client = subprocess.Popen(
                    [sys.executable, "-c", FLOOD, str(port), f"{counter}/{round_}-{index}",
                     args.path],
                    stdout=subprocess.DEVNULL,
                    preexec_fn=functools.partial(os.nice, args.nice),
                )  # fmt: skip
                clients.append(client)
                stack.callback(stop_process, client)
            time.sleep(1)
            started = time.monotonic()
            flooded += scrapes(port, args.scrapes)
            seconds += time.monotonic() - started
            for client in clients:
                client.terminate()
                client.wait(10)
            answered += sum(int(Path(f"{counter}/{round_}-{i}").read_text() or 0)
                            for i in range(args.clients))  # fmt: skip
    (rest50, rest99), (flood50, flood99) = quantiles(rest), quantiles(flooded)
    print(f"/processes?limit=0: {size / 1e3:.0f} kB; {args.path}: {answered / seconds:.0f} "
          f"answered 200 a second to {args.clients} clients at nice {args.nice}; serve "
          f"--interval {args.interval}")  # fmt: skip
    print(f"/metrics at rest:   p50 {rest50 * 1e3:6.2f} ms  p99 {rest99 * 1e3:6.2f} ms")
    print(f"/metrics in flood:  p50 {flood50 * 1e3:6.2f} ms  p99 {flood99 * 1e3:6.2f} ms")
    print(f"flood / rest:       p50 x{flood50 / rest50:.2f}      p99 x{flood99 / rest99:.2f}")


if __name__ == "__main__":
    main()

"""What hostile clients do to scrapes (docs/deploy.md, "What the listener withstands"): a
real `procdelta serve` on 127.0.0.1 behind basic auth, its `/metrics` scraped one at a time
with the password, at rest and under each flood in turn, the two phases alternated
`--rounds` times; per flood the scrapes' p50 and p99 against rest's, and what the flood cost
the server (its CPU per hostile request, its log lines). The floods:

- `fields`: heads of 16,000 empty header fields (64 KiB each), back to back;
- `pipeline`: well-behaved clients pipelining 500 requests at a time, reading every answer;
- `unread`: clients without credentials pipelining 20,000 requests, never reading;
- `resets`: clients pipelining 8,000 requests, then resetting the connection;
- `sighup`: SIGHUP to `serve` 200 times a second (each re-reads `--web.config.file`);
- `passwords`: clients asking with a wrong password, back to back (a bcrypt check each).

Each flood's clients are processes of their own at `--nice` 19 (clients on other machines,
whose own work takes nothing from the node). Every process it starts is stopped when it
ends, also on an error or a signal. Not part of the tests: it takes minutes, and prints
numbers.

    python -m tests.tools.floods --clients 8 --scrapes 200 --rounds 2
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bcrypt

from tests.net import free_port, request, stop_process, wait_until

PASSWORD = "scrape-secret"
AUTH = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()

CLIENT = r"""
import base64, signal, socket, struct, sys, time
kind, port, counter, auth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
done = 0
def stop(*_):
    open(counter, "w").write(str(done))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
ask = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
def connect():
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock
def read_answers(sock, count):
    got = b""
    while got.count(b"HTTP/1.1 ") < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return
        got += chunk
        got = got[-64:] if got.count(b"HTTP/1.1 ") == 0 else got
while True:
    try:
        if kind == "fields":
            with connect() as sock:
                sock.sendall(ask + b"a:\r\n" * 16000 + b"\r\n")
                sock.recv(4096)
                done += 1
        elif kind == "pipeline":
            with connect() as sock:
                one = ask + b"Authorization: " + auth.encode() + b"\r\n\r\n"
                for _ in range(20):
                    sock.sendall(one * 500)
                    seen = 0
                    while seen < 500:
                        chunk = sock.recv(1 << 20)
                        if not chunk:
                            raise OSError
                        seen += chunk.count(b"HTTP/1.1 200")
                    done += 500
        elif kind == "unread":
            sock = connect()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                sock.sendall((ask + b"\r\n") * 20000)
            except OSError:
                pass
            done += 1
            time.sleep(0.5)
            sock.close()
        elif kind == "resets":
            sock = connect()
            sock.sendall((ask + b"Authorization: " + auth.encode() + b"\r\n\r\n") * 8000)
            sock.recv(1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            done += 1
        elif kind == "passwords":
            wrong = "Basic " + base64.b64encode(b"prometheus:guess%d" % done).decode()
            with connect() as sock:
                sock.sendall(ask + b"Authorization: " + wrong.encode() + b"\r\n\r\n")
                sock.recv(4096)
                done += 1
    except OSError:
        time.sleep(0.01)
"""
"""One hostile client of `kind`, until SIGTERM; then the count of what it sent written to a
file (heads, batches of 500, pipelines, resets or guesses)."""

FLOODS = ("fields", "pipeline", "unread", "resets", "sighup", "passwords")


def scrapes(port: int, count: int) -> list[float]:
    """`count` scrapes one after the other, each one's seconds (a refused one: 60 s)."""
    took = []
    for _ in range(count):
        started = time.perf_counter()
        try:
            status = request(port, "/metrics", {"Authorization": AUTH})[0]
        except OSError:
            status = 0
        took.append(time.perf_counter() - started if status == 200 else 60.0)
        time.sleep(0.01)
    return took


def quantiles(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), statistics.quantiles(samples, n=100)[98]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="hostile clients per flood")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per phase")
    parser.add_argument("--rounds", type=int, default=2, help="rest and flood, alternated")
    parser.add_argument("--floods", default=",".join(FLOODS), help="which, comma-separated")
    parser.add_argument("--nice", type=int, default=19, help="the hostile clients' niceness")
    parser.add_argument(
        "--source", default=".", help="the checkout whose serve is flooded (another commit's)"
    )
    args = parser.parse_args()
    floods = [f for f in args.floods.split(",") if f]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="floods-")))
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        config = work / "web.yml"
        config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        port = free_port()
        log = (work / "serve.log").open("w")
        serve = subprocess.Popen(
            [sys.executable, "-m", "collector", "serve", "--web.listen-address",
             f"127.0.0.1:{port}", "--web.config.file", str(config)],
            stdout=subprocess.DEVNULL, stderr=log, cwd=args.source,
        )  # fmt: skip
        stack.callback(stop_process, serve)
        wait_until(
            lambda: request(port, "/metrics", {"Authorization": AUTH})[0] == 200, 60, "serve"
        )
        time.sleep(1)
        rows = []
        for flood in floods:
            rest: list[float] = []
            flooded: list[float] = []
            sent, cpu, lines = 0, 0.0, 0
            for round_ in range(args.rounds):
                rest += scrapes(port, args.scrapes)
                clients = []
                stop = threading.Event()
                if flood == "sighup":
                    hups = [0]

                    def storm(hups=hups, stop=stop) -> None:
                        while not stop.wait(0.005):
                            serve.send_signal(signal.SIGHUP)
                            hups[0] += 1

                    stormer = threading.Thread(target=storm, daemon=True)
                    stormer.start()
                else:
                    for index in range(args.clients):
                        client = subprocess.Popen(
                            [sys.executable, "-c", CLIENT, flood, str(port),
                             str(work / f"{flood}-{round_}-{index}"), AUTH],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=functools.partial(os.nice, args.nice),
                        )  # fmt: skip
                        clients.append(client)
                        stack.callback(stop_process, client)
                time.sleep(1)
                log.flush()
                lines_before = len((work / "serve.log").read_text().splitlines())
                cpu_before = cpu_seconds(serve.pid)
                flooded += scrapes(port, args.scrapes)
                cpu += cpu_seconds(serve.pid) - cpu_before
                stop.set()
                for client in clients:
                    client.terminate()
                    client.wait(10)
                if flood == "sighup":
                    sent += hups[0]
                else:
                    sent += sum(
                        int((work / f"{flood}-{round_}-{i}").read_text() or 0)
                        for i in range(args.clients)
                    )
                time.sleep(1)
                lines += len((work / "serve.log").read_text().splitlines()) - lines_before
            (r50, r99), (f50, f99) = quantiles(rest), quantiles(flooded)
            refused = sum(took == 60.0 for took in flooded)
            rows.append((flood, r50, r99, f50, f99, sent, cpu, lines, refused))
        assert serve.poll() is None, "serve ended during the floods"
    print(f"{args.clients} clients a flood at nice {args.nice}; {args.scrapes} scrapes a phase, "
          f"{args.rounds} rounds; scrape times in ms")  # fmt: skip
    print(f"{'flood':10} {'rest p50':>9} {'p99':>7} {'flood p50':>10} {'p99':>7} {'p99 x':>6} "
          f"{'sent':>8} {'CPU µs/sent':>12} {'log lines':>10} {'refused':>8}")  # fmt: skip
    for flood, r50, r99, f50, f99, sent, cpu, lines, refused in rows:
        per = cpu / sent * 1e6 if sent else 0.0
        print(f"{flood:10} {r50 * 1e3:9.2f} {r99 * 1e3:7.2f} {f50 * 1e3:10.2f} {f99 * 1e3:7.2f} "
              f"{f99 / r99:6.2f} {sent:8d} {per:12.0f} {lines:10d} {refused:8d}")  # fmt: skip


if __name__ == "__main__":
    main()

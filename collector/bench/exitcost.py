"""What the kernel's exit records cost a served process: `python -m collector.bench.exitcost`
(needs root), and the bench's last table (`exit_costs`, `exit_legend`, `exit_lines`).

With `--collector.exits`, `serve` takes one netlink message per task exiting on the node
(collector/exits.py) and closes each in the next pass (`Tracker.close`): its cost grows with
the node's exit rate. Over the bench's default N=1000 table, with a paced exit storm beside
it (collector/storm.py: short threads, one exit in `FORK_EVERY` a forked child, at a target
rate), a real `procdelta serve --interval 0.5` runs without the flag and with it, one after
the other in each round, which of them first alternating from round to round, each scraped
once a pass as the served rows are (`measure_served`). Of each run's span of passes: the
process's CPU a second (psutil: every thread, the listener's included); the exits the storm
made (its own count) and the tasks the node made (`/proc/stat`'s `processes`: in a steady
state the node's exits, the storm's and the machine's own, each of which the listener
hears); with the flag, the records its page counted (`procdelta_exit_records_total` of
every outcome but `unplaced`, which counts again records counted under `closed` or `born`),
those of them past the queue's bound (`dropped`) and the times the socket's buffer
overflowed (`procdelta_exit_record_overflows_total`); a pass's own time (the page's
`procdelta_pass_duration_seconds`), the peak RSS, and the storm's own CPU (the kernel makes
and sends a task's record in that task's exit, at the task's expense). Per rate: the
medians of each, the median of the rounds' ratios (with the flag over without, in the same
round) and of the rounds' extra CPU per record (the difference over the records counted a
second); the records against the exits over every round (that arithmetic: exitruns.py).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence

from collector.bench.exitruns import ExitCost, ExitRun, Mark, StormCount, mark, median, run_between
from collector.bench.floor import read_file
from collector.bench.serve import SERVED_INTERVAL, Page, serve_process
from collector.bench.served import measure_served
from collector.bench.tables import pid_room, synthetic_table

EXIT_RATES = (1000, 5000)  # exits a second the storm is asked for; the 2-core VM keeps both
EXIT_ROUNDS = 3
EXIT_PASSES = 20  # a run's span: 10 s at --interval 0.5
EXIT_PROCESSES = 1000  # the table under the serve: the bench's default N=1000
GUARD = 0.5
"""The regression guard's bound: a record may cost the served process at most half what a
pass without the flag costs it for one process of the table (`ExitCost.guard`)."""
# one exit in 50 a forked child's, the others threads' (a fork costs the storm ~40 times a
# thread: forks alone would crowd two CPUs long before 5,000 exits a second)
FORK_EVERY = 50


class Storm:
    """A running collector/storm.py: `count` asks it what it has done."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def count(self) -> StormCount:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()
        made, cpu_ns, at_ns = (int(x) for x in self.process.stdout.readline().split())
        return StormCount(made, cpu_ns, at_ns)


@contextlib.contextmanager
def exit_storm(rate: float, fork_every: int = FORK_EVERY) -> Iterator[Storm]:
    """collector/storm.py at `rate` exits a second, in a process of its own; stopped (its
    stdin closed) and reaped after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "collector.storm", f"{rate:g}", str(fork_every)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        if process.stdout is None or process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the exit storm did not start")
        yield Storm(process)
    finally:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tasks_made(path: str = "/proc/stat") -> int:
    """The tasks (processes and threads) the node has made since it booted (`processes`)."""
    with open(path, "rb") as stat:
        found = re.search(rb"^processes (\d+)", stat.read(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{path} has no processes line")
    return int(found[1])


def peak_rss(pid: int) -> float:
    """MB: a process's peak resident memory (`VmHWM`)."""
    with open(f"/proc/{pid}/status", "rb") as status:
        found = re.search(rb"^VmHWM:\s+(\d+) kB", status.read(), re.MULTILINE)
    return 0.0 if found is None else int(found[1]) * 1024 / 1e6


def measure_exit_run(
    storm: Storm, exits: bool, passes: int = EXIT_PASSES, interval: float = SERVED_INTERVAL
) -> ExitRun:
    """A real `procdelta serve` (with `--collector.exits` where `exits`) beside the storm,
    its span of `passes` measured as a served row's is (`measure_served`), each end marked
    by the storm's count, the node's tasks and the page's counters."""
    marks: list[Mark] = []

    def at_end(page: Page) -> None:
        marks.append(mark(page, storm.count(), tasks_made(), time.monotonic()))

    args = ["--collector.exits"] if exits else []
    with serve_process(args, interval) as (pid, scraper):
        served = measure_served(pid, scraper, passes, interval=interval, ends=at_end)
        peak = peak_rss(pid)
    start, end = marks
    return run_between(exits, served.cpu_per_pass * served.passes, start, end, peak)


def exit_costs(
    rates: Sequence[float] = EXIT_RATES,
    rounds: int = EXIT_ROUNDS,
    passes: int = EXIT_PASSES,
    processes: int = EXIT_PROCESSES,
    fork_every: int = FORK_EVERY,
    interval: float = SERVED_INTERVAL,
) -> list[ExitCost]:
    """Each rate's rounds over a default table of `processes` (0: none), the storm started
    anew for each rate and running through its rounds."""
    costs = []
    with contextlib.ExitStack() as stack:
        if processes:
            stack.enter_context(pid_room(processes * 3))
            stack.enter_context(synthetic_table(processes, "idle"))
        for rate in rates:
            pairs: list[tuple[ExitRun, ExitRun]] = []
            with exit_storm(rate, fork_every) as storm:
                for round_ in range(rounds):
                    order = (False, True) if round_ % 2 == 0 else (True, False)
                    runs = {
                        exits: measure_exit_run(storm, exits, passes, interval) for exits in order
                    }
                    pairs.append((runs[False], runs[True]))
            costs.append(ExitCost(rate, pairs))
    return costs


def exit_legend(
    rounds: int = EXIT_ROUNDS,
    passes: int = EXIT_PASSES,
    processes: int = EXIT_PROCESSES,
    fork_every: int = FORK_EVERY,
    interval: float = SERVED_INTERVAL,
) -> list[str]:
    table = f"the default N={processes} table" if processes else "the machine as it is"
    forks = f"one exit in {fork_every} a forked child's" if fork_every else "no forked child"
    text = (
        f"exit records: what --collector.exits costs a served process. Over {table}, beside a "
        f"storm of exits at a fixed rate (short threads; {forks}), a real `procdelta serve "
        f"--interval {interval:g}` without the flag and with it in each of {rounds} rounds "
        f"(which first alternates), each over {passes} passes, scraped once a pass as the "
        "served rows are. exits/s: the rate asked of the storm; made/s: the exits it made a "
        "second; rec/s: the records the page counted a second (the node's other exits too). "
        "without, with: the serve process's CPU (every thread) in ms a second, the medians of "
        "the runs; ratio: the median of the rounds' with over without; µs/rec: each round's "
        "extra CPU over its records a second, the median. Over every run with the flag: "
        "records: what the pages counted (procdelta_exit_records_total, every outcome but "
        "unplaced, which counts some again); storm: the exits the storm made; node: the tasks "
        "the node made (/proc/stat processes: every exit the listener hears, the storm's and "
        "the machine's own); counted: records over node; drop: records past the queue's bound, "
        "and ovfl: the socket buffer's overflows (each lost records). Below: a pass's own time "
        "(the records are closed in it) and the peak RSS, the medians without and with; the "
        "storm's CPU an exit with the listener less without (the kernel making and sending the "
        "record, in the exit)."
    )
    return textwrap.wrap(text, 95)


def exit_lines(
    costs: Sequence[ExitCost],
    processes: int = EXIT_PROCESSES,
    interval: float = SERVED_INTERVAL,
) -> list[str]:
    """The table's rows, then a line a rate on the passes, the memory and the storm's own
    cost, the regression guard (`GUARD`), and one on what 1,000 exits a second cost the
    served process."""
    lines = [
        f"{'exits/s':>8} {'made/s':>8} {'rec/s':>8} {'without':>8} {'with':>8} {'ratio':>6} "
        f"{'µs/rec':>7} {'records':>9} {'storm':>9} {'node':>9} {'counted':>8} {'drop':>7} "
        f"{'ovfl':>5}"
    ]
    for cost in costs:
        per_record = cost.per_record * 1e6
        counted = f"{cost.records / cost.tasks:.1%}" if cost.tasks else "-"
        lines.append(
            f"{cost.rate:>8,.0f} {cost.made_per_second:>8,.0f} {cost.records_per_second:>8,.0f} "
            f"{cost.without * 1e3:>8.1f} {cost.with_ * 1e3:>8.1f} "
            + (f"{'-':>6} " if math.isnan(cost.ratio) else f"{cost.ratio:>6.2f} ")
            + (f"{'-':>7} " if math.isnan(per_record) else f"{per_record:>7.1f} ")
            + f"{cost.records:>9,} {cost.made:>9,} {cost.tasks:>9,} {counted:>8} "
            f"{cost.dropped:>7,} {cost.overflows:>5}"
        )
    for cost in costs:
        (pass_without, pass_with), (rss_without, rss_with) = cost.passes, cost.peak_rss
        lines.append(
            f"at {cost.rate:,.0f}/s: a pass {pass_without * 1e3:.1f} ms, {pass_with * 1e3:.1f} ms; "
            f"peak RSS {rss_without:.1f} MB, {rss_with:.1f} MB; the storm's CPU an exit "
            f"{cost.storm_extra * 1e6:+.1f} µs"
        )
        came = ", ".join(f"{name} {count:,}" for name, count in cost.outcomes.items() if count)
        if came:
            lines.append(f"at {cost.rate:,.0f}/s the records came to: {came}")
        guard = cost.guard(processes, interval)
        if not math.isnan(guard):
            verdict = "within" if guard <= GUARD else "OVER"
            lines.append(
                f"at {cost.rate:,.0f}/s guard: a record costs {guard:.2f} of what a pass costs "
                f"for one process of the table ({verdict} its bound, {GUARD:g})"
            )
    if not any(w.records is not None for cost in costs for _, w in cost.rounds):
        lines.append(
            "no exit records: `serve --collector.exits` heard none here (it needs CAP_NET_ADMIN, "
            "the host's network namespace and a kernel with CONFIG_TASKSTATS)"
        )
    per_record = median(cost.per_record for cost in costs if not math.isnan(cost.per_record))
    if not math.isnan(per_record):
        lines.append(
            f"1,000 exits a second cost the served process {per_record * 1e6:.0f} ms of CPU a "
            f"second ({per_record * 1e5:.1f}% of a core; the rates' µs/rec, their median)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collector.bench.exitcost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--rates",
        type=lambda text: [float(rate) for rate in text.split(",")],
        default=list(EXIT_RATES),
        help="exits a second asked of the storm, comma-separated (default 1000,5000)",
    )
    parser.add_argument("--rounds", type=int, default=EXIT_ROUNDS)
    parser.add_argument("--passes", type=int, default=EXIT_PASSES, help="a run's span")
    parser.add_argument("--interval", type=float, default=SERVED_INTERVAL, help="serve's")
    parser.add_argument(
        "--processes", type=int, default=EXIT_PROCESSES, help="the idle table under it (0: none)"
    )
    parser.add_argument("--fork-every", type=int, default=FORK_EVERY, help="0: threads only")
    args = parser.parse_args(argv)
    if min(args.rounds, args.passes, args.interval, *args.rates) <= 0:
        print(
            "exitcost: --rates, --rounds, --passes and --interval must be positive", file=sys.stderr
        )
        return 2
    if min(args.processes, args.fork_every) < 0:
        print("exitcost: --processes and --fork-every must be 0 or more", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        parser.exit(1, "exitcost: needs root (--collector.exits needs CAP_NET_ADMIN)\n")
    shape = (args.rounds, args.passes, args.processes, args.fork_every, args.interval)
    print(f"Linux {os.uname().release}, {os.cpu_count()} CPUs, load average {_load()}")
    for line in exit_legend(*shape):
        print(line, flush=True)
    for line in exit_lines(exit_costs(args.rates, *shape), args.processes, args.interval):
        print(line)
    print(f"load average after: {_load()}")
    return 0


def _load() -> str:
    return b" ".join(read_file("/proc/loadavg").split()[:3]).decode()


if __name__ == "__main__":
    sys.exit(main())

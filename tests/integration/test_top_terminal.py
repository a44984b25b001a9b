"""`procdelta top` on and off a terminal: plain text a block per interval, the live loop
(keys, resizes, intervals, failures), and the live screen in a pseudo-terminal (q and
Ctrl-C quit, the terminal's attributes come back)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import re
import select
import selectors
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector import top
from tests.net import free_port
from tests.unit.test_top_screen import one_process, plain

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
LEADER = Path(sys.executable).name[:15]  # a workload's comm, its threads' unless named

# --- plain text off a terminal -----------------------------------------------------------


def interruptible() -> None:
    """In `top`'s child before it runs: SIGINT as a terminal's shell leaves it. A shell
    starting the tests in the background (`cmd &`, a CI runner's script) ignores SIGINT, its
    children inherit that, and Python then installs no KeyboardInterrupt handler: `top`
    would never see the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ViewsEnd(Exception):
    """A viewer asked for a view past those a test gave it: the live loop's end in a test
    (an exception a test catches, where a KeyboardInterrupt escaping would stop the whole
    session rather than fail one test)."""


class Steps:
    """A viewer whose steps hand out `views` in turn (an exception is raised), then raise
    `end`: ViewsEnd, or KeyboardInterrupt where Ctrl-C is what the test is about."""

    origin = ""

    def __init__(self, *views, end: type[BaseException] = ViewsEnd):
        self.views = list(views)
        self.end = end
        self.steps = 0

    def step(self):
        self.steps += 1
        if not self.views:
            raise self.end
        view = self.views.pop(0)
        if isinstance(view, Exception):
            raise view
        return view


@contextlib.contextmanager
def ctrl_c_is_caught(where: str) -> Iterator[None]:
    """A KeyboardInterrupt escaping `where` fails the test (it would otherwise stop the
    whole session)."""
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail(f"Ctrl-C escaped {where}")


def test_plain_text_is_a_block_per_interval_until_interrupted():
    """Off a terminal: nothing for a first pass, then each interval's block, a blank line
    between blocks, no trailing spaces; Ctrl-C ends it quietly."""
    out = io.StringIO()
    viewer = Steps(None, one_process(11), one_process(22), end=KeyboardInterrupt)
    with ctrl_c_is_caught("run_plain"):
        top.run_plain(viewer, top.Selection(), 0, out)
    text = out.getvalue()
    assert text.startswith("procdelta top  node") and text.endswith(" /a\n")
    blocks = text.split("\n\nprocdelta top  node")
    assert len(blocks) == 2 and " 11 x " in blocks[0] and " 22 x " in blocks[1]
    assert all(line == line.rstrip() for line in out.getvalue().splitlines())


class FakeLive:
    def __init__(self):
        self.drawn: list[str] = []

    def update(self, renderable, refresh: bool) -> None:
        assert refresh
        self.drawn.append("\n".join(line.rstrip() for line in plain(renderable)))


@contextlib.contextmanager
def live_pipes() -> Iterator[tuple[int, int, int, int]]:
    """(keys' read end, its write end, resizes' read end, its write end)."""
    keys, typed = os.pipe()
    resized, resize = os.pipe2(os.O_NONBLOCK)
    try:
        yield keys, typed, resized, resize
    finally:
        for fd in (keys, typed, resized, resize):
            with contextlib.suppress(OSError):
                os.close(fd)


def live_loop(viewer, interval: float, keys, resized, live: FakeLive | None = None) -> FakeLive:
    """The live loop on an 80-by-24 console, drawing into `live` (a new one by default)."""
    live = live if live is not None else FakeLive()
    console = top.Console(width=80, height=24)
    top.terminal._live_loop(live, console, viewer, top.Selection(), interval, keys, resized)
    return live


def test_the_live_loop_redraws_on_a_key_or_a_resize_and_quits_on_q():
    with live_pipes() as (keys, typed, resized, resize):
        os.write(resize, b".")
        os.write(typed, b"x")
        viewer = Steps(one_process(11))
        waiting = threading.Timer(0.5, os.write, (typed, b"Q"))
        waiting.start()
        try:
            live = live_loop(viewer, 60, keys, resized)
        finally:
            waiting.cancel()
        # drawn once, again for the resize and the key (ready together), not refreshed
        assert viewer.steps == 1 and len(live.drawn) == 2
        assert all(" 11 x " in screen and "q quits" in screen for screen in live.drawn)
        with pytest.raises(BlockingIOError):  # the resize read, not left to wake it again
            os.read(resized, 64)


def test_the_live_loop_refreshes_every_interval_and_keeps_the_last_view_on_a_failure():
    with live_pipes() as (keys, _typed, resized, _resize):
        viewer = Steps(one_process(11), top.TopError("gone"), None, one_process(22))
        with pytest.raises(ViewsEnd):  # the viewer's end, after its views
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 5
    with live_pipes() as (_, _typed, resized, _resize):
        viewer = Steps(one_process(11), top.TopError("gone"), None, one_process(22))
        live = FakeLive()
        with pytest.raises(ViewsEnd):
            live_loop(viewer, 0.01, None, resized, live)
        assert [" 11 x " in s for s in live.drawn] == [True, True, True, False]
        assert "refresh failed: gone" in live.drawn[1] and "refresh failed" in live.drawn[2]
        assert " 22 x " in live.drawn[3]


def test_the_live_loop_goes_on_refreshing_after_its_input_ends():
    with live_pipes() as (keys, typed, resized, _resize):
        os.close(typed)
        viewer = Steps(one_process(11), one_process(22))
        with pytest.raises(ViewsEnd):
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 3


def test_a_first_view_that_fails_ends_the_live_loop_with_its_error():
    with live_pipes() as (keys, _, resized, _), pytest.raises(top.TopError, match="refused"):
        live_loop(Steps(top.TopError("refused")), 60, keys, resized)


class Clock:
    """terminal.py's `time`: a monotonic clock that moves only by its sleeps (each one
    kept), the steps and the waits that move it."""

    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class SlowSteps(Steps):
    """Steps that each take `takes` seconds of `clock`."""

    def __init__(self, clock: Clock, takes: float, *views, **steps):
        super().__init__(*views, **steps)
        self.clock, self.takes = clock, takes

    def step(self):
        self.clock.now += self.takes
        return super().step()


def test_plain_text_is_each_screen_at_80_columns_an_interval_after_the_last_was_due(
    monkeypatch,
):
    """Each block is the view's screen as it is drawn, where its passes come from and how
    often, 80 columns whatever the environment's COLUMNS says; the next one comes an
    interval after the last was due, not an interval after it was printed."""
    monkeypatch.setenv("COLUMNS", "40")
    clock = Clock()
    monkeypatch.setattr(top.terminal, "time", clock)
    viewer = SlowSteps(clock, 0.2, None, one_process(11), one_process(22), end=KeyboardInterrupt)
    viewer.origin = "http://x:1"
    out = io.StringIO()
    with ctrl_c_is_caught("run_plain"):
        top.run_plain(viewer, top.Selection(), 0.5, out)
    block = [
        "procdelta top  node  by run delay  interval 1.00s at --:--:--",
        "from http://x:1 (its passes; refreshed every 0.5s)",
        "",
        "    PID COMM             THR ON-CPU RUN-DELAY WAIT%  USER   SYS GROUP",
        "     {} x                  -      -         -     -     -     - /a",
    ]
    assert out.getvalue() == "\n".join([*block, "", *block, ""]).format(11, 22)
    assert clock.slept == pytest.approx([0.3, 0.3, 0.3])


class TickingSelectors:
    """terminal.py's `selectors` on a Clock: a wait returns at once what is ready, or else
    moves the clock by its timeout; each wait's timeout kept."""

    EVENT_READ = selectors.EVENT_READ

    def __init__(self, clock: Clock):
        self.clock = clock
        self.waits: list[float] = []

    def DefaultSelector(self):
        return TickingSelector(self)


class TickingSelector:
    def __init__(self, ticking: TickingSelectors):
        self.ticking = ticking
        self.real = selectors.DefaultSelector()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.real.close()

    def register(self, fd: int, events: int) -> None:
        self.real.register(fd, events)

    def unregister(self, fd: int) -> None:
        self.real.unregister(fd)

    def select(self, timeout: float):
        self.ticking.waits.append(timeout)
        ready = self.real.select(0)
        if not ready:
            self.ticking.clock.now += timeout
        return ready


def test_the_live_loop_refreshes_an_interval_after_the_last_was_due(monkeypatch):
    """The first refresh an interval after the first view is drawn; each next one an
    interval after the last was due: a view that takes 0.2 s of a 0.5 s interval leaves
    0.3 s to wait."""
    clock = Clock()
    ticking = TickingSelectors(clock)
    monkeypatch.setattr(top.terminal, "time", clock)
    monkeypatch.setattr(top.terminal, "selectors", ticking)
    viewer = SlowSteps(clock, 0.2, one_process(11), one_process(22), one_process(33))
    with live_pipes() as (keys, _typed, resized, _resize), pytest.raises(ViewsEnd):
        live_loop(viewer, 0.5, keys, resized)
    assert viewer.steps == 4
    assert ticking.waits == pytest.approx([0.5, 0.3, 0.3])


def test_the_live_screen_is_drawn_to_the_consoles_height_with_where_it_comes_from():
    """A live screen: its head says where its passes come from and how often, then how
    to quit; no more rows than the console is high."""
    processes = [{"pid": pid, "comm": "x", "group": {"cgroup": "/a"}} for pid in range(1, 31)]
    viewer = Steps(top.View({"interval_seconds": 1, "processes": processes}))
    viewer.origin = "http://x:1"
    with live_pipes() as (keys, typed, resized, _resize):
        os.write(typed, b"q")
        live = live_loop(viewer, 60, keys, resized)
    (screen,) = live.drawn
    lines = screen.splitlines()
    assert lines[:4] == [
        "procdelta top  node  by run delay  interval 1.00s at --:--:--",
        "from http://x:1 (its passes; refreshed every 60s)",
        "q quits",
        "",
    ]
    assert [line.split()[0] for line in lines[4:]] == ["PID", *map(str, range(1, 25))]


def test_the_live_screen_on_a_terminal_reads_keys_in_cbreak_mode_and_gives_it_back(
    monkeypatch,
):
    """On a terminal: rich's alternate screen, drawn only when `top` says (no refresh
    thread of rich's), stdout and stderr left alone; stdin in cbreak mode while it runs
    (each key read as it is typed, not echoed), a `q` typed there quits at once, and the
    terminal's modes come back as they were."""
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    lives = []

    class Recording:
        """rich's Live: its arguments, and the terminal's local modes at each draw (the
        first one types `q`)."""

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.modes: list[int] = []
            lives.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def update(self, renderable, refresh: bool) -> None:
            self.modes.append(termios.tcgetattr(slave)[3])
            os.write(master, b"q")

    stdin = open(slave, "rb", buffering=0, closefd=False)  # noqa: SIM115
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(top.terminal, "Live", Recording)
    viewer = Steps(one_process(11), one_process(22))
    try:
        top.run_live(viewer, top.Selection(), 2.0)
        after = termios.tcgetattr(slave)
    finally:
        stdin.close()
        os.close(master)
        os.close(slave)
    (live,) = lives
    console = live.kwargs.get("console")
    assert isinstance(console, top.Console)
    assert live.kwargs == {"console": console, "screen": True, "auto_refresh": False,
                           "redirect_stdout": False, "redirect_stderr": False}  # fmt: skip
    assert viewer.steps == 1  # quit by the q, before a refresh
    assert live.modes and all(not mode & (termios.ICANON | termios.ECHO) for mode in live.modes)
    assert after == before


def test_the_live_screen_off_a_terminal_ends_quietly_on_ctrl_c(capsys):
    """Without a terminal on stdin no cbreak mode is set; Ctrl-C (the viewer's end) gives
    the screen back without a traceback."""
    viewer = Steps(one_process(11), end=KeyboardInterrupt)
    with ctrl_c_is_caught("run_live"):
        top.run_live(viewer, top.Selection(), 0.01)
    assert viewer.steps == 2 and "Traceback" not in capsys.readouterr().err


def test_sigterm_and_sighup_stop_the_screen_and_their_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for signum in before:
        with pytest.raises(top.terminal._Stop), top.terminal._signals_stop():
            os.kill(os.getpid(), signum)
            time.sleep(1)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_resize_writes_a_byte_to_wait_on_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGWINCH)
    with top.terminal._resizes() as resized:
        os.kill(os.getpid(), signal.SIGWINCH)
        os.kill(os.getpid(), signal.SIGWINCH)
        assert os.read(resized, 64) == b".."
    assert signal.getsignal(signal.SIGWINCH) == before
    with pytest.raises(OSError):
        os.fstat(resized)


def test_logs_wait_while_the_screen_is_taken_the_last_50_kept():
    root = logging.getLogger()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    root.addHandler(keep)
    try:
        with top.terminal._logs_held():
            for n in range(60):
                logging.getLogger("collector.test").warning("line %d", n)
            assert seen == []
        assert seen == [f"line {n}" for n in range(10, 60)]
        assert keep in root.handlers
    finally:
        root.removeHandler(keep)


def test_json_is_one_indented_document():
    out = io.StringIO()
    top.print_json(top.View({"processes": []}, threads=[]), out)
    assert (
        out.getvalue()
        == json.dumps({"processes": [], "threads_interval_seconds": None, "threads": []}, indent=2)
        + "\n"
    )


# --- the live screen in a pseudo-terminal ------------------------------------------------


TERMINAL_ENV = {
    **{name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")},
    "TERM": "xterm-256color",
}
"""The environment of `top` on the pseudo-terminal: its size is the terminal's, not one a
parent's environment says (pytest-xdist's workers set COLUMNS and LINES)."""


class Terminal:
    """`procdelta top` on a pseudo-terminal of 80x24 that is its controlling terminal."""

    def __init__(self, *args: str):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.slave = slave
        self.before = termios.tcgetattr(slave)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collector", "top", "--interval", "0.5", *args],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=lambda: (interruptible(), fcntl.ioctl(0, termios.TIOCSCTTY, 0)),
            env=TERMINAL_ENV,
        )  # fmt: skip
        self.output = b""

    def read_until(self, pattern: bytes, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while pattern not in self.output and time.time() < deadline:
            self._drain(0.1)
        assert pattern in self.output, self.output[-2000:]

    def _drain(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            with contextlib.suppress(OSError):
                self.output += os.read(self.master, 65536)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 15) -> int:
        deadline = time.time() + timeout
        while self.process.poll() is None and time.time() < deadline:
            self._drain(0.1)
        self._drain(0.1)
        return self.process.wait(timeout=1)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal() -> Iterator[callable]:
    made: list[Terminal] = []

    def make(*args: str) -> Terminal:
        made.append(Terminal(*args))
        return made[-1]

    yield make
    for each in made:
        each.close()


ENTER_SCREEN, LEAVE_SCREEN = b"\x1b[?1049h", b"\x1b[?1049l"


@pytest.mark.parametrize(
    "key", [b"q", b"\x03", signal.SIGTERM, signal.SIGHUP], ids=["q", "ctrl-c", "term", "hup"]
)
def test_the_live_screen_quits_and_gives_the_terminal_back(terminal, key):
    screen = terminal("--limit", "5")
    screen.read_until(ENTER_SCREEN)
    screen.read_until(b"s at ")  # "interval 0.50s at ...": a refresh after the first pass
    assert termios.tcgetattr(screen.slave) != screen.before  # cbreak: no echo, no lines
    if isinstance(key, bytes):
        screen.type(key)
    else:  # the session's end: `kubectl exec` closed, the terminal hung up
        screen.process.send_signal(key)
    assert screen.wait() == 0
    assert termios.tcgetattr(screen.slave) == screen.before
    assert screen.output.rindex(LEAVE_SCREEN) > screen.output.rindex(ENTER_SCREEN)
    shown = ANSI.sub(b"", screen.output).decode("utf-8", "replace")
    assert "procdelta top  node  by run delay  interval" in shown
    assert "PID COMM" in shown and "Traceback" not in shown


def test_an_error_in_the_live_screen_is_one_line_and_gives_the_terminal_back(terminal):
    screen = terminal("--from", f"http://127.0.0.1:{free_port()}")
    code = screen.wait()
    assert code == 1
    assert termios.tcgetattr(screen.slave) == screen.before
    after = screen.output[screen.output.rindex(LEAVE_SCREEN) + len(LEAVE_SCREEN) :]
    lines = ANSI.sub(b"", after).decode().strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], lines


def test_a_resized_terminal_is_redrawn_at_once(terminal):
    screen = terminal("--interval", "60")  # no refresh due while the test runs
    screen.read_until(b"first pass done")
    mark = len(screen.output)
    fcntl.ioctl(screen.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))

    def widths() -> set[int]:
        """The widths of the lines of the frames drawn since (each from the screen's top)."""
        frames = screen.output[mark:].split(b"\x1b[H")[1:]
        shown = ANSI.sub(b"", b"\r\n".join(frames)).decode("utf-8", "replace")
        return {len(line) for line in shown.split("\r\n")}

    deadline = time.time() + 10
    while 100 not in widths() and time.time() < deadline:
        screen._drain(0.1)
    assert 100 in widths() and max(widths()) <= 100
    screen.type(b"q")
    assert screen.wait() == 0


def test_from_with_threads_asks_for_every_process_and_keeps_a_processes_url():
    """With --threads the served processes are matched to this node's threads, so the
    server's cut must not drop any (limit=0, whatever --limit); a URL naming /processes
    itself is taken as it is, not as /processes/processes."""
    threads = top.RemoteFeed(
        top.Remote("http://127.0.0.1:9746"),
        top.Selection(pod=("shop", "web"), threads=True, limit=5),
    )
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(threads.url).query))
    assert query["limit"] == "0"
    url = top.processes_url("http://127.0.0.1:9746/processes", {"limit": "3"})
    assert urllib.parse.urlsplit(url).path == "/processes"
    assert top.share(0, 0) == "-" and top.share(1, 3) == "25%"

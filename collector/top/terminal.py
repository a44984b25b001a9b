"""Running `top`: a live screen on a terminal (the alternate screen, stdin in cbreak mode
for `q`, both restored however `top` ends), plain text elsewhere, or one interval's JSON."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator

from rich.console import Console
from rich.live import Live

from collector.top.core import Selection, View, Viewer
from collector.top.errors import TopError
from collector.top.screen import PLAIN_WIDTH, plain_console, render

# --- running ---------------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM or SIGHUP: end like `q`, the terminal restored on the way out."""


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    def stop(*_):
        raise _Stop

    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _logs_held() -> Iterator[None]:
    """While the screen is taken, log records wait; they are written after it is given
    back (a line written meanwhile would be drawn over)."""
    root = logging.getLogger()
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)
            del held[:-50]

    handlers = root.handlers[:]
    root.handlers[:] = [Hold()]
    try:
        yield
    finally:
        root.handlers[:] = handlers
        for record in held:
            root.handle(record)


@contextlib.contextmanager
def _resizes() -> Iterator[int]:
    """A pipe that gets a byte each time the terminal is resized (SIGWINCH): its read end,
    to wait on beside the keys."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def resized(*_) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, b".")

    saved = signal.signal(signal.SIGWINCH, resized)
    try:
        yield read_end
    finally:
        signal.signal(signal.SIGWINCH, saved)
        os.close(read_end)
        os.close(write_end)


def run_live(viewer: Viewer, selection: Selection, interval: float) -> None:
    """The live screen until `q`, Ctrl-C, SIGTERM or SIGHUP: stdin in cbreak mode (when
    it is a terminal), the alternate screen; both given back however it ends."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    console = Console()
    try:
        with _signals_stop(), _resizes() as resized:
            if fd is not None:
                tty.setcbreak(fd)
            with (
                _logs_held(),
                Live(
                    console=console,
                    screen=True,
                    auto_refresh=False,
                    redirect_stdout=False,
                    redirect_stderr=False,
                ) as live,
            ):
                _live_loop(live, console, viewer, selection, interval, fd, resized)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if fd is not None and saved is not None:  # (saved: a terminal's, so with its fd)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live_loop(
    live: Live,
    console: Console,
    viewer: Viewer,
    selection: Selection,
    interval: float,
    keys: int | None,
    resized: int,
) -> None:
    """Refresh every `interval`, redraw on a resize or a key; return on `q`."""
    view: View | None = None

    def draw() -> None:
        live.update(
            render(view, selection, console.width, viewer.origin, interval, True, console.height),
            refresh=True,
        )

    view = viewer.step()
    draw()
    due = time.monotonic() + interval
    # a selector (epoll), not select(): no bound on the descriptors' numbers
    with selectors.DefaultSelector() as waiting:
        waiting.register(resized, selectors.EVENT_READ)
        if keys is not None:
            waiting.register(keys, selectors.EVENT_READ)
        while True:
            ready = {key.fd for key, _ in waiting.select(max(due - time.monotonic(), 0))}
            if ready:
                if resized in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(resized, 64)
                if keys in ready:
                    typed = os.read(keys, 64)
                    if not typed:
                        waiting.unregister(keys)
                        keys = None  # end of input: no more keys, the refreshes go on
                    elif b"q" in typed.lower():
                        return
                draw()
                continue
            due = max(due + interval, time.monotonic())
            try:
                latest = viewer.step()
            except TopError as error:
                if view is None:
                    raise
                view.note = f"refresh failed: {error}"
            else:
                if latest is not None:
                    view = latest
            draw()


def run_plain(viewer: Viewer, selection: Selection, interval: float, out) -> None:
    """Not on a terminal: one block of plain text per interval, until stopped."""
    console = plain_console(out)
    first = True
    due = time.monotonic()
    try:
        while True:
            view = viewer.step()
            if view is not None:
                with console.capture() as captured:
                    console.print(render(view, selection, PLAIN_WIDTH, viewer.origin, interval))
                text = "\n".join(line.rstrip() for line in captured.get().splitlines())
                out.write(("" if first else "\n") + text + "\n")
                out.flush()
                first = False
            due = max(due + interval, time.monotonic())
            time.sleep(max(due - time.monotonic(), 0))
    except KeyboardInterrupt:
        pass


def print_json(view: View, out) -> None:
    out.write(json.dumps(view.as_json(), indent=2) + "\n")
    out.flush()

"""What clients may hold of the listener at once (collector/listener.py), counted in one
place: the connections open, the answers in flight (`--web.max-requests`), the basic auth
checks waiting, the views made aside; and the bounds themselves (`Limits`). Pure: the
listener's connections ask `Admission` before they answer and act on what it says."""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from collector.http11 import Response

HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 120.0
WRITE_TIMEOUT = 30.0
MAX_REQUESTS = 40
MAX_CONNECTIONS = 4096
MAX_GATES = 64
"""Gates (`Deferred`) waiting at once with `--web.max-requests 0`."""
MAX_ASIDE = 4
"""Answers made aside (`Deferred(aside=True)`: views) waiting or being made at once."""
PIPELINED_PER_TURN = 1
"""Requests of one connection answered at once before the event loop serves the others: a
client that pipelines thousands in one read takes its turns like everyone else. Why one:
`python -m tests.tools.floods`, in docs/deploy.md ("What the listener withstands")."""


class Deferred:
    """A handler's answer that must not run on the event loop: `work` runs in a worker
    thread of the listener's and returns the response — a gate (a bcrypt check) in
    `Listener.slow`, any other (a view made on request) in `Listener.views`.

    A `gate` (basic auth) holds no place among `max_requests` while it waits and runs, as
    node_exporter's bound sits behind exporter-toolkit's checks: clients without the
    password cannot turn scrapers away. Its answer takes a place when it is written. At
    most `max_requests` gates wait at once (or `MAX_GATES`, without a bound); one more is
    answered 503 at once.

    An answer made `aside` (a view, in `Listener.views`) likewise holds no place while it
    waits and is made, so that a burst of views cannot turn scrapers and probes away; at
    most `MAX_ASIDE` wait or are made at once, one more is answered 503 at once. Any other
    `Deferred` holds its place throughout."""

    __slots__ = ("aside", "gate", "work")

    def __init__(
        self, work: Callable[[], Response | Deferred], gate: bool = False, aside: bool = False
    ):
        self.work = work
        self.gate = gate
        self.aside = aside


@dataclass
class Limits:
    max_requests: int = MAX_REQUESTS
    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT


GATE, ASIDE, REQUEST = "gate", "aside", "request"
"""The places a request's answer takes (`Admission.enter`)."""


@dataclass(frozen=True, slots=True)
class TurnedAway:
    """An answer refused its place: the log line's reason, and the client's 503 text."""

    reason: str
    text: str


Connection = TypeVar("Connection", bound=Hashable)


class Admission(Generic[Connection]):
    """Every bound on what clients hold at once, counted in one place (the event loop's
    thread alone touches it): the connections open, and which of them has waited longest
    for a request; the answers in flight (`--web.max-requests`); the basic auth checks
    waiting (gates); the views made aside. The connections act on what it answers."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.in_flight = 0  # answers holding a --web.max-requests place
        self.gates = 0  # gates (`Deferred`) waiting or running
        self.aside = 0  # answers made aside (views) waiting or being made
        self.connections = 0
        self.waiting: collections.OrderedDict[Connection, None] = collections.OrderedDict()

    def connected(self) -> Connection | None:
        """A connection opened: the one to evict for it, over `max_connections` (the one
        waiting longest for a request: a flood evicts itself, not a scraper mid-request)."""
        self.connections += 1
        if self.connections > self.limits.max_connections and self.waiting:
            oldest, _ = self.waiting.popitem(last=False)
            return oldest
        return None

    def disconnected(self, connection: Connection) -> None:
        self.connections -= 1
        self.waiting.pop(connection, None)

    def waits(self, connection: Connection) -> None:
        """`connection` waits for a request, now the newest to."""
        self.waiting.pop(connection, None)
        self.waiting[connection] = None

    def stops_waiting(self, connection: Connection) -> None:
        self.waiting.pop(connection, None)

    def enter(self, answer: Response | Deferred) -> str | TurnedAway:
        """The place `answer` takes: a gate or a view made aside outside
        --web.max-requests, each within its own bound; any other within it. Or why it is
        turned away (503)."""
        if isinstance(answer, Deferred) and answer.gate:
            if self.gates >= (self.limits.max_requests or MAX_GATES):
                return TurnedAway("503: too many checks waiting", self._too_many())
            self.gates += 1
            return GATE
        if isinstance(answer, Deferred) and answer.aside:
            if self.aside >= MAX_ASIDE:
                return TurnedAway(
                    "503: too many views waiting",
                    f"too many views at once ({MAX_ASIDE}); try again later",
                )
            self.aside += 1
            return ASIDE
        if 0 < self.limits.max_requests <= self.in_flight:
            return TurnedAway("503: --web.max-requests reached", self._too_many())
        self.in_flight += 1
        return REQUEST

    def leave(self, place: str) -> None:
        if place == GATE:
            self.gates -= 1
        elif place == ASIDE:
            self.aside -= 1
        else:
            self.in_flight -= 1

    def _too_many(self) -> str:
        return (
            f"too many requests at once (--web.max-requests {self.limits.max_requests}); "
            "try again later"
        )

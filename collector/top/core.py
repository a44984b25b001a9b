"""What `top` shows and where it comes from: the selection, one interval's view, the
feed of `top`'s own passes, and the viewer that joins a feed to the threads read here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from collector.processes import DEFAULT_LIMIT, DEFAULT_SORT, PassView, Query
from collector.top.errors import TopError
from collector.top.threads import THREAD_FIELDS, ThreadRow, ThreadWatch

# --- what to show --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """What the person asked for: one pod or cgroup (or the node), the order, how many
    rows (None: all), and whether the group's processes are split into threads."""

    pod: tuple[str, str] | None = None  # (namespace, name)
    cgroup: str | None = None
    sort: str = DEFAULT_SORT
    limit: int | None = DEFAULT_LIMIT
    threads: bool = False

    @property
    def filters(self) -> tuple[tuple[str, str], ...]:
        if self.pod is not None:
            return (("namespace", self.pod[0]), ("pod", self.pod[1]))
        if self.cgroup is not None:
            return (("cgroup", self.cgroup),)
        return ()

    @property
    def scope(self) -> str:
        if self.pod is not None:
            return f"pod {self.pod[0]}/{self.pod[1]}"
        if self.cgroup is not None:
            return f"cgroup {self.cgroup}"
        return "node"

    def query(self) -> Query:
        """What to ask for: with --threads every process of the group (its threads are all
        read), cut to the limit afterwards (`View.cut`)."""
        return Query(self.filters, self.sort, None if self.threads else self.limit)

    @property
    def thread_sort(self) -> str:
        return self.sort if self.sort in THREAD_FIELDS else DEFAULT_SORT


def parse_pod(value: str) -> tuple[str, str] | None:
    """(namespace, name) of `NAMESPACE/NAME`; None where it is not that."""
    namespace, slash, name = value.partition("/")
    if not (slash and namespace and name) or "/" in name:
        return None
    return namespace, name


# --- where the documents come from -----------------------------------------------------


@dataclass(slots=True)
class View:
    """One interval as `top` shows it: the /processes document, the PIDs of the group's
    processes with their names (what --threads reads), and the group's threads."""

    document: dict[str, Any]
    pids: dict[int, str] = field(default_factory=dict)
    threads: list[ThreadRow] | None = None  # None: not asked for
    threads_interval_ns: int | None = None
    note: str = ""  # what the person should know about this view (a failed refresh, say)

    def cut(self, selection: Selection) -> None:
        """Processes and threads sorted and cut to the selection's limit."""
        limit = selection.limit
        processes = self.document.get("processes") or []
        self.document["processes"] = processes[:limit] if limit is not None else processes
        if self.threads is not None:
            name = selection.thread_sort
            self.threads.sort(key=lambda row: (-getattr(row, name), row.tid))
            if limit is not None:
                del self.threads[limit:]

    def as_json(self) -> dict[str, Any]:
        document = dict(self.document)
        if self.threads is not None:
            document["threads_interval_seconds"] = (
                None if self.threads_interval_ns is None else self.threads_interval_ns / 1e9
            )
            document["threads"] = [row.as_dict() for row in self.threads]
        return document


class LocalFeed:
    """Passes of `top`'s own engine; `fetch` runs one and makes its document."""

    def __init__(self, engine, selection: Selection, cgroup_fields: bool = True):
        self.engine = engine
        self.selection = selection
        self.cgroup_fields = cgroup_fields
        self.origin = ""

    def fetch(self) -> View:
        """A pass; its view (after the first pass, with no interval yet, an empty
        document: only the group's PIDs, for the threads' first reading)."""
        result = self.engine.run_pass()
        query = self.selection.query()
        pids: dict[int, str] = {}
        if self.selection.threads:
            pids = dict.fromkeys(result.processes.pids(query), "")
        if result.interval_ns is None:
            return View({}, pids)
        document = PassView.of(result).document(query, self.cgroup_fields)
        return View(document, pids)


# --- one interval --------------------------------------------------------------------


class Viewer:
    """A feed and, with --threads, the group's threads read here: one `View` a call."""

    def __init__(self, feed, selection: Selection, threads: ThreadWatch | None = None):
        self.feed = feed
        self.selection = selection
        self.threads = threads

    @property
    def origin(self) -> str:
        return self.feed.origin

    def step(self) -> View | None:
        """The next view (None while `top`'s own first pass has no interval yet)."""
        view = self.feed.fetch()
        if self.threads is not None:
            view.threads = self.threads.read(view.pids)
            view.threads_interval_ns = self.threads.interval_ns
        if not view.document:  # a first pass: only the threads' first reading
            return None
        view.cut(self.selection)
        return view


def one_interval(viewer: Viewer, interval: float, sleep=time.sleep) -> View:
    """`--format json`: one interval. Own passes: two, `interval` apart. From a server:
    one GET (with --threads, the threads read twice, `interval` apart)."""
    first = viewer.step()
    if first is not None:  # from a server
        if viewer.threads is None:
            return first
        sleep(interval)
        # with --threads: read the same PIDs again
        first.threads = viewer.threads.read(first.pids)
        first.threads_interval_ns = viewer.threads.interval_ns
        first.cut(viewer.selection)
        return first
    sleep(interval)
    view = viewer.step()
    if view is None:
        raise TopError("the pass over the proc filesystem failed; see the log")
    return view

"""`procdelta top`: the processes view (docs/reference.md §8) live, for a person.

Each interval `top` gets one document, the answer of `/processes`: from its own passes
(an engine of its own, `PassView.document`), or from a running `serve` (`--from URL`). For
one group (`--pod`, `--cgroup`) it shows the group's own cgroup above its processes, so
that a wait reads as its own limit, its own threads or its neighbours at a glance; with
`--threads` it reads that group's threads itself, from the proc filesystem, each guarded
like the collector's (docs/reference.md §2), and shows which thread waits.

The view is drawn with rich: on a terminal a live screen (the alternate screen, stdin in
cbreak mode for `q`, both restored however `top` ends); elsewhere plain text, one block
per interval, 80 columns, no escape codes. `--format json` prints one interval's document
and exits.

By concern: `core` (the selection, a view, `top`'s own feed, the viewer), `errors`, `threads`
(`--threads`), `remote` (`--from`), `screen` (the drawing) and `terminal` (running it);
this package holds their names together for cli.py.
"""

from __future__ import annotations

from rich.console import Console

from collector.output import printable
from collector.top.core import (
    LocalFeed,
    Selection,
    View,
    Viewer,
    one_interval,
    parse_pod,
)
from collector.top.errors import BadValue, TopError
from collector.top.remote import (
    MAX_ANSWER_BYTES,
    REQUEST_TIMEOUT,
    Remote,
    RemoteFeed,
    processes_url,
)
from collector.top.screen import (
    PLAIN_WIDTH,
    group_lines,
    plain_console,
    render,
    share,
    short_count,
    short_time,
)
from collector.top.terminal import print_json, run_live, run_plain
from collector.top.threads import THREAD_FIELDS, ThreadRow, ThreadWatch, check_same_node, local_comm

__all__ = [
    "MAX_ANSWER_BYTES",
    "PLAIN_WIDTH",
    "REQUEST_TIMEOUT",
    "THREAD_FIELDS",
    "BadValue",
    "Console",
    "LocalFeed",
    "Remote",
    "RemoteFeed",
    "Selection",
    "ThreadRow",
    "ThreadWatch",
    "TopError",
    "View",
    "Viewer",
    "check_same_node",
    "group_lines",
    "local_comm",
    "one_interval",
    "parse_pod",
    "plain_console",
    "print_json",
    "printable",
    "processes_url",
    "render",
    "run_live",
    "run_plain",
    "share",
    "short_count",
    "short_time",
]

"""The command line: the only place flags live. Builds the objects and runs them."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import click

from collector import __version__
from collector.aggregate import Totals
from collector.engine import Engine, PassResult
from collector.groups import Grouper, PodNames
from collector.procfs import ProcFS
from collector.reading import Reader, boottime_ns
from collector.tracker import Tracker

log = logging.getLogger("procdelta")

LOG_LEVELS = ("debug", "info", "warn", "error")


@dataclass(frozen=True)
class Options:
    """The options every command shares."""

    procfs: str
    pod_logs: str
    container_logs: str
    per_container: bool
    pods_only: bool


def _env(option: str) -> str:
    """`--path.procfs` → `PROCDELTA_PATH_PROCFS`: dots and dashes become underscores."""
    return "PROCDELTA_" + option.lstrip("-").replace(".", "_").replace("-", "_").upper()


def _option(flag: str, name: str, **kwargs):
    return click.option(flag, name, envvar=_env(flag), show_envvar=True, **kwargs)


def shared_options(command: Callable) -> Callable:
    """The options of SPEC §6 that every command takes, folded into one `Options`."""

    @_option(
        "--path.procfs",
        "procfs",
        default="/proc",
        show_default=True,
        help="Mount point of the proc filesystem to read.",
    )
    @_option(
        "--path.pod-logs",
        "pod_logs",
        default="/var/log/pods",
        show_default=True,
        help="kubelet's pod log directory: pod names by UID.",
    )
    @_option(
        "--path.container-logs",
        "container_logs",
        default="/var/log/containers",
        show_default=True,
        help="kubelet's container log links: container names by ID.",
    )
    @_option(
        "--per-container",
        "per_container",
        is_flag=True,
        help="Split pods by container (adds `container`, `container_id` labels).",
    )
    @_option(
        "--pods-only",
        "pods_only",
        is_flag=True,
        help="Drop the groups of processes that are in no pod.",
    )
    @_option(
        "--log.level",
        "log_level",
        type=click.Choice(LOG_LEVELS),
        default="info",
        show_default=True,
        help="Only log messages of this severity or above.",
    )
    @functools.wraps(command)
    def wrapper(procfs, pod_logs, container_logs, per_container, pods_only, log_level, **kw):
        _configure_logging(log_level)
        _check_procfs(procfs)
        options = Options(procfs, pod_logs, container_logs, per_container, pods_only)
        return command(options, **kw)

    return wrapper


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, "WARNING" if level == "warn" else level.upper()),
        format="%(asctime)s level=%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _check_procfs(root: str) -> None:
    """Refuse a `--path.procfs` that is no proc filesystem, judged by what it holds."""
    try:
        entries = os.listdir(root)
    except OSError as error:
        raise click.ClickException(f"--path.procfs {root}: {error.strerror}") from None
    if not any(name.isdigit() and os.path.isdir(os.path.join(root, name)) for name in entries):
        raise click.ClickException(
            f"--path.procfs {root}: not a proc filesystem (no process directories)"
        )


def _positive_interval(_ctx, _param, value: float) -> float:
    if not value > 0:
        raise click.BadParameter(f"must be > 0 seconds, got {value:g}")
    return value


def build_engine(
    options: Options, clock: Callable[[], int] = boottime_ns, hz: int | None = None
) -> Engine:
    """Wire the layers for a run: ProcFS → Reader → Tracker → Grouper → Engine."""
    reader = Reader(ProcFS(options.procfs), clock=clock)
    tracker = Tracker(hz or os.sysconf("SC_CLK_TCK"))
    names = PodNames(options.pod_logs, options.container_logs)
    grouper = Grouper(names, per_container=options.per_container, pods_only=options.pods_only)
    return Engine(reader, tracker, grouper, Totals())


def run_once(engine: Engine, interval: float, sleep: Callable[[float], None]) -> PassResult:
    """Two passes `interval` seconds apart; the second one's result."""
    engine.run_pass()
    sleep(interval)
    return engine.run_pass()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="procdelta")
def cli() -> None:
    """Per-pod process counters for Prometheus: deltas of /proc counters taken on the node."""


@cli.command()
@_option(
    "--interval",
    "interval",
    type=float,
    default=2.0,
    show_default=True,
    callback=_positive_interval,
    help="Seconds between the two passes.",
)
@_option(
    "--format",
    "output_format",
    type=click.Choice(("table", "json")),
    default="table",
    show_default=True,
    help="Output: a table for a person, or JSON.",
)
@shared_options
def once(options: Options, interval: float, output_format: str) -> None:
    """Two passes INTERVAL seconds apart, then print the interval of every group."""
    from collector import output

    result = run_once(build_engine(options), interval, time.sleep)
    text = output.as_json(result) if output_format == "json" else output.as_table(result)
    click.echo(text)


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's errors become one line on stderr and a non-zero exit."""
    try:
        code = cli.main(args=argv, prog_name="procdelta", standalone_mode=False)
    except click.ClickException as error:
        click.echo(f"procdelta: error: {error.format_message()}", err=True)
        sys.exit(error.exit_code)
    except (click.Abort, KeyboardInterrupt):
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)

"""The command line's options: those every command takes (`shared_options`, folded into one
`Options`), each also set by its environment variable, and the checks of their values. The
commands themselves are collector/cli.py's."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import click
import cloup

from collector import logs
from collector.exits import BUFFER_BYTES
from collector.wiring import Options

LOG_LEVELS = ("debug", "info", "warn", "error")


def env_name(flag: str) -> str:
    """`--path.procfs` → `PROCDELTA_PATH_PROCFS`: dots and dashes become underscores. A
    switch (`--collector.cgroup/--no-collector.cgroup`) is named by its first form and
    takes true or false."""
    flag = flag.split("/")[0]
    return "PROCDELTA_" + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def option(flag: str, name: str, **kwargs):
    """An option that its environment variable also sets; a switch's default shown as
    on or off."""
    if kwargs.get("is_flag") or "/" in flag:
        kwargs.setdefault("default", False)
        kwargs["show_default"] = "on" if kwargs["default"] else "off"
    return click.option(flag, name, envvar=env_name(flag), show_envvar=True, **kwargs)


class BadInput(click.UsageError):
    """A value the command cannot take (a flag's, or its environment variable's): one
    line, exit status 2, like every other mistake in the invocation (docs/operating.md,
    "Exit status")."""


def shared_options(command: Callable) -> Callable:
    """The options of docs/reference.md §6 that every command takes, folded into one `Options`,
    in the groups of docs/operating.md (their headings in `--help`)."""

    @cloup.option_group(
        "Paths",
        option(
            "--path.procfs",
            "procfs",
            default="/proc",
            show_default=True,
            help="Mount point of the proc filesystem to read.",
        ),
        option(
            "--path.cgroupfs",
            "cgroupfs",
            default="/sys/fs/cgroup",
            show_default=True,
            help="Mount point of the cgroup filesystem (the host's, in a container).",
        ),
        option(
            "--path.pod-logs",
            "pod_logs",
            default="/var/log/pods",
            show_default=True,
            help="kubelet's pod log directory: pod names by UID.",
        ),
        option(
            "--path.container-logs",
            "container_logs",
            default="/var/log/containers",
            show_default=True,
            help="kubelet's container log links: container names by ID.",
        ),
    )
    @cloup.option_group(
        "Collectors",
        option(
            "--collector.cgroup/--no-collector.cgroup",
            "cgroup",
            default=True,
            show_default=True,
            help="Read each group's own cgroup: its CPU (exited processes included), "
            "throttling and pressure.",
        ),
        option(
            "--collector.cgroup.pressure/--no-collector.cgroup.pressure",
            "pressure",
            default=True,
            show_default=True,
            help="Read the cgroups' PSI files (cgroup v2), where the node has them.",
        ),
        option(
            "--collector.cgroup.pressure.cpu-only",
            "cpu_pressure_only",
            is_flag=True,
            default=False,
            help="Of the PSI files, read the CPU one alone (why a pod waited needs it); "
            "leave memory and I/O pressure out (four series a pod fewer).",
        ),
        option(
            "--collector.exits/--no-collector.exits",
            "exits",
            default=False,
            show_default=True,
            help="Close each task's last interval with the kernel's exit record (TASKSTATS "
            "netlink): needs CAP_NET_ADMIN and the host's network and PID namespaces.",
        ),
        option(
            "--collector.exits.buffer-bytes",
            "exits_buffer_bytes",
            type=click.IntRange(min=1 << 16, max=1 << 30),
            default=BUFFER_BYTES,
            show_default=True,
            help="The exit records' socket receive buffer: what arrives while the listener "
            "waits is held there.",
        ),
    )
    @cloup.option_group(
        "Export",
        option(
            "--export.interval-gauges/--no-export.interval-gauges",
            "interval_gauges",
            default=True,
            show_default=True,
            help="Export procdelta_interval_<field>, the last interval as the node measured it.",
        ),
        option(
            "--export.totals/--no-export.totals",
            "totals",
            default=True,
            show_default=True,
            help="Export procdelta_<field>_total counters, for rate() and increase().",
        ),
    )
    @cloup.option_group(
        "Groups",
        option(
            "--per-container",
            "per_container",
            is_flag=True,
            help="Split pods by container (adds `container`, `container_id` labels).",
        ),
        option(
            "--pods-only",
            "pods_only",
            is_flag=True,
            help="Drop the groups of processes that are in no pod.",
        ),
    )
    @cloup.option_group(
        "Logging",
        option(
            "--log.level",
            "log_level",
            type=click.Choice(LOG_LEVELS),
            default="info",
            show_default=True,
            help="Only log messages of this severity or above.",
        ),
        option(
            "--log.format",
            "log_format",
            type=click.Choice(logs.FORMATS),
            default="logfmt",
            show_default=True,
            help="Output format of log messages.",
        ),
    )
    @functools.wraps(command)
    def wrapper(
        procfs,
        pod_logs,
        container_logs,
        cgroupfs,
        cgroup,
        pressure,
        cpu_pressure_only,
        exits,
        exits_buffer_bytes,
        interval_gauges,
        totals,
        per_container,
        pods_only,
        log_level,
        log_format,
        **kw,
    ):
        logs.configure(log_level, log_format)
        check_procfs(procfs)
        if not (interval_gauges or totals):
            raise BadInput(
                "--no-export.interval-gauges with --no-export.totals exports no per-group "
                "field at all: keep one of them"
            )
        options = Options(
            procfs=procfs,
            pod_logs=pod_logs,
            container_logs=container_logs,
            per_container=per_container,
            pods_only=pods_only,
            cgroupfs=cgroupfs,
            cgroup=cgroup,
            pressure=pressure,
            interval_gauges=interval_gauges,
            totals=totals,
            cpu_pressure_only=cpu_pressure_only,
            exits=exits,
            exits_buffer_bytes=exits_buffer_bytes,
        )
        return command(options, **kw)

    return wrapper


def check_procfs(root: str) -> None:
    """Refuse a `--path.procfs` that is no proc filesystem, judged by what it holds."""
    try:
        entries = os.listdir(root)
    except OSError as error:
        raise BadInput(f"--path.procfs {root}: {error.strerror}") from None
    if not any(name.isdigit() and os.path.isdir(os.path.join(root, name)) for name in entries):
        raise BadInput(f"--path.procfs {root}: not a proc filesystem (no process directories)")


MIN_INTERVAL = 0.01
"""Seconds: below a pass's own time, passes would follow one another without pause."""
MAX_INTERVAL = 86_400.0
"""Seconds: a day; `inf` or more would never end `once` nor give `serve` a second pass."""


def positive_interval(_ctx, _param, value: float) -> float:
    if not value > 0:
        raise click.BadParameter(f"must be > 0 seconds, got {value:g}")
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise click.BadParameter(
            f"want {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds, got {value:g}"
        )
    return value


def not_empty(_ctx, param: click.Parameter, value: str | None) -> str | None:
    """A path option set empty: a mistake (a manifest's variable left blank), never a
    wish for the default. click takes an empty variable for an unset one: said here."""
    envvar = param.envvar if isinstance(param.envvar, str) else None
    if value == "" or (value is None and envvar and os.environ.get(envvar) == ""):
        where = f"{envvar} (for {param.opts[0]})" if value is None else param.opts[0]
        raise BadInput(f"{where}: empty: name a file, or leave it unset")
    return value


def pod_name(_ctx, _param, value: str | None) -> tuple[str, str] | None:
    from collector.top import parse_pod

    if value is None:
        return None
    pod = parse_pod(value)
    if pod is None:
        raise click.BadParameter(f"{value!r}: want NAMESPACE/NAME")
    return pod


def cgroup_path(_ctx, _param, value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise click.BadParameter(f"{value!r}: want the cgroup's path on the host, from /")
    return value


def passes_group(default: float, help_text: str):
    """The "Passes" heading of a command's help: its `--interval`."""
    return cloup.option_group(
        "Passes",
        option(
            "--interval",
            "interval",
            type=float,
            default=default,
            show_default=True,
            callback=positive_interval,
            help=help_text,
        ),
    )

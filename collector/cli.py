"""The command line: the only place flags live. Builds the objects and runs them."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable

import click
import cloup

from collector import __version__, logs
from collector.engine import Engine, PassResult
from collector.privileges import own_missing_capabilities, refused_reads
from collector.processes import DEFAULT_LIMIT, DEFAULT_SORT, MAX_LIMIT, SORT_FIELDS
from collector.wiring import Options, build_engine, node_cpus, node_sources

log = logging.getLogger("procdelta")

LOG_LEVELS = ("debug", "info", "warn", "error")


def _env(option: str) -> str:
    """`--path.procfs` → `PROCDELTA_PATH_PROCFS`: dots and dashes become underscores. A
    switch (`--collector.cgroup/--no-collector.cgroup`) is named by its first form and
    takes true or false."""
    option = option.split("/")[0]
    return "PROCDELTA_" + option.lstrip("-").replace(".", "_").replace("-", "_").upper()


def _option(flag: str, name: str, **kwargs):
    """An option that its environment variable also sets; a switch's default shown as
    on or off."""
    if kwargs.get("is_flag") or "/" in flag:
        kwargs.setdefault("default", False)
        kwargs["show_default"] = "on" if kwargs["default"] else "off"
    return click.option(flag, name, envvar=_env(flag), show_envvar=True, **kwargs)


class BadInput(click.UsageError):
    """A value the command cannot take (a flag's, or its environment variable's): one
    line, exit status 2, like every other mistake in the invocation (docs/operating.md,
    "Exit status")."""


def shared_options(command: Callable) -> Callable:
    """The options of docs/reference.md §6 that every command takes, folded into one `Options`,
    in the groups of docs/operating.md (their headings in `--help`)."""

    @cloup.option_group(
        "Paths",
        _option(
            "--path.procfs",
            "procfs",
            default="/proc",
            show_default=True,
            help="Mount point of the proc filesystem to read.",
        ),
        _option(
            "--path.cgroupfs",
            "cgroupfs",
            default="/sys/fs/cgroup",
            show_default=True,
            help="Mount point of the cgroup filesystem (the host's, in a container).",
        ),
        _option(
            "--path.pod-logs",
            "pod_logs",
            default="/var/log/pods",
            show_default=True,
            help="kubelet's pod log directory: pod names by UID.",
        ),
        _option(
            "--path.container-logs",
            "container_logs",
            default="/var/log/containers",
            show_default=True,
            help="kubelet's container log links: container names by ID.",
        ),
    )
    @cloup.option_group(
        "Collectors",
        _option(
            "--collector.cgroup/--no-collector.cgroup",
            "cgroup",
            default=True,
            show_default=True,
            help="Read each group's own cgroup: its CPU (exited processes included), "
            "throttling and pressure.",
        ),
        _option(
            "--collector.cgroup.pressure/--no-collector.cgroup.pressure",
            "pressure",
            default=True,
            show_default=True,
            help="Read the cgroups' PSI files (cgroup v2), where the node has them.",
        ),
        _option(
            "--collector.cgroup.pressure.cpu-only",
            "cpu_pressure_only",
            is_flag=True,
            default=False,
            help="Of the PSI files, read the CPU one alone (why a pod waited needs it); "
            "leave memory and I/O pressure out (four series a pod fewer).",
        ),
        _option(
            "--collector.exits/--no-collector.exits",
            "exits",
            default=False,
            show_default=True,
            help="Close each task's last interval with the kernel's exit record (TASKSTATS "
            "netlink): needs CAP_NET_ADMIN and the host's network and PID namespaces.",
        ),
        _option(
            "--collector.exits.buffer-bytes",
            "exits_buffer_bytes",
            type=click.IntRange(min=1 << 16, max=1 << 30),
            default=16 << 20,
            show_default=True,
            help="The exit records' socket receive buffer: what arrives while the listener "
            "waits is held there.",
        ),
    )
    @cloup.option_group(
        "Export",
        _option(
            "--export.interval-gauges/--no-export.interval-gauges",
            "interval_gauges",
            default=True,
            show_default=True,
            help="Export procdelta_interval_<field>, the last interval as the node measured it.",
        ),
        _option(
            "--export.totals/--no-export.totals",
            "totals",
            default=True,
            show_default=True,
            help="Export procdelta_<field>_total counters, for rate() and increase().",
        ),
    )
    @cloup.option_group(
        "Groups",
        _option(
            "--per-container",
            "per_container",
            is_flag=True,
            help="Split pods by container (adds `container`, `container_id` labels).",
        ),
        _option(
            "--pods-only",
            "pods_only",
            is_flag=True,
            help="Drop the groups of processes that are in no pod.",
        ),
    )
    @cloup.option_group(
        "Logging",
        _option(
            "--log.level",
            "log_level",
            type=click.Choice(LOG_LEVELS),
            default="info",
            show_default=True,
            help="Only log messages of this severity or above.",
        ),
        _option(
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
        _check_procfs(procfs)
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


def _check_procfs(root: str) -> None:
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


def _positive_interval(_ctx, _param, value: float) -> float:
    if not value > 0:
        raise click.BadParameter(f"must be > 0 seconds, got {value:g}")
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise click.BadParameter(
            f"want {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds, got {value:g}"
        )
    return value


def _not_empty(_ctx, param: click.Parameter, value: str | None) -> str | None:
    """A path option set empty: a mistake (a manifest's variable left blank), never a
    wish for the default. click takes an empty variable for an unset one: said here."""
    envvar = param.envvar if isinstance(param.envvar, str) else None
    if value == "" or (value is None and envvar and os.environ.get(envvar) == ""):
        where = f"{envvar} (for {param.opts[0]})" if value is None else param.opts[0]
        raise BadInput(f"{where}: empty: name a file, or leave it unset")
    return value


def _pod_name(_ctx, _param, value: str | None) -> tuple[str, str] | None:
    from collector.top import parse_pod

    if value is None:
        return None
    pod = parse_pod(value)
    if pod is None:
        raise click.BadParameter(f"{value!r}: want NAMESPACE/NAME")
    return pod


def _cgroup_path(_ctx, _param, value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise click.BadParameter(f"{value!r}: want the cgroup's path on the host, from /")
    return value


def _passes_group(default: float, help_text: str):
    """The "Passes" heading of a command's help: its `--interval`."""
    return cloup.option_group(
        "Passes",
        _option(
            "--interval",
            "interval",
            type=float,
            default=default,
            show_default=True,
            callback=_positive_interval,
            help=help_text,
        ),
    )


def run_once(
    engine: Engine,
    interval: float,
    sleep: Callable[[float], None],
    run_pass: Callable[[], PassResult | None] | None = None,
) -> PassResult:
    """Two passes `interval` seconds apart; the second one's result."""
    run_pass = run_pass or engine.run_pass
    run_pass()
    sleep(interval)
    result = run_pass()
    if result is None:
        raise click.ClickException("the pass over the proc filesystem failed; see the log")
    return result


@cloup.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="procdelta")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Per-pod process counters for Prometheus: deltas of /proc counters taken on the node.

    Start with `procdelta once`; run `procdelta serve` for Prometheus.
    """
    if ctx.invoked_subcommand is None:  # bare `procdelta`: its usage, as node_exporter's -h
        click.echo(ctx.get_help())


@cli.command()
@_passes_group(2.0, "Seconds between the two passes.")
@cloup.option_group(
    "Output",
    _option(
        "--format",
        "output_format",
        type=click.Choice(("table", "json", "prometheus")),
        default="table",
        show_default=True,
        help="Output: a table for a person, JSON, or the /metrics exposition.",
    ),
    _option(
        "--wide",
        "wide",
        is_flag=True,
        help="The table with every field, group names whole (wider than 80 columns).",
    ),
)
@shared_options
def once(options: Options, interval: float, output_format: str, wide: bool) -> None:
    """Print what every group did over one interval: a first look, no server.

    Two passes INTERVAL seconds apart, then the interval of every group as a table, JSON or
    the exposition that `serve` serves.
    """
    from collector import output
    from collector.passloop import PassLoop

    engine = build_engine(options)
    found = node_sources(options, engine)
    text: bytes | str
    if output_format == "prometheus":
        loop = PassLoop(
            engine,
            interval,
            shapes=options.shapes,
            sources=found,
            cpus=node_cpus(options),
            say_denied=False,
        )
        result = run_once(engine, interval, time.sleep, run_pass=loop.run_pass)
        text = loop.snapshot().text
    elif output_format == "json":
        result = run_once(engine, interval, time.sleep)
        text = output.as_json(result, cgroup_fields=options.cgroup) + "\n"
    else:
        result = run_once(engine, interval, time.sleep)
        text = output.as_table(result, cgroup_fields=options.cgroup, wide=wide) + "\n"
    if result.denied:
        log.warning("%s", refused_reads(result.denied, own_missing_capabilities()))
    click.echo(text, nl=False)


@cli.command()
@_passes_group(2.0, "Seconds between refreshes (and between top's own passes).")
@cloup.option_group(
    "Source",
    _option(
        "--from",
        "source",
        default=None,
        metavar="URL",
        help="Read a running `procdelta serve`'s /processes at URL (e.g. "
        "http://127.0.0.1:9746 through kubectl port-forward) instead of running passes.",
    ),
    _option("--from.username", "username", default=None, help="Basic auth user for --from."),
    _option(
        "--from.password-file",
        "password_file",
        default=None,
        help="File holding the basic auth password for --from.",
    ),
    _option("--from.ca-file", "ca_file", default=None, help="CA certificates to trust (TLS)."),
    _option(
        "--from.cert-file", "cert_file", default=None, help="Client certificate to present (TLS)."
    ),
    _option("--from.key-file", "key_file", default=None, help="Key of the client certificate."),
    _option(
        "--from.insecure-skip-verify",
        "insecure_skip_verify",
        is_flag=True,
        help="Do not verify the server's certificate.",
    ),
)
@cloup.option_group(
    "View",
    _option(
        "--pod",
        "pod",
        default=None,
        metavar="NAMESPACE/NAME",
        callback=_pod_name,
        help="Show this pod only.",
    ),
    _option(
        "--cgroup",
        "cgroup_path",
        default=None,
        metavar="PATH",
        callback=_cgroup_path,
        help="Show this cgroup only (its path on the host, as the cgroup label gives it).",
    ),
    _option(
        "--sort",
        "sort",
        type=click.Choice(SORT_FIELDS),
        default=DEFAULT_SORT,
        show_default=True,
        help="The field to sort by, biggest first.",
    ),
    _option(
        "--limit",
        "limit",
        type=click.IntRange(0, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        show_default=True,
        help="Rows to show (0: all).",
    ),
    _option(
        "--threads",
        "threads",
        is_flag=True,
        help="Split the group's processes into their threads, read from --path.procfs "
        "(needs --pod or --cgroup).",
    ),
)
@cloup.option_group(
    "Output",
    _option(
        "--format",
        "output_format",
        type=click.Choice(("table", "json")),
        default="table",
        show_default=True,
        help="A live table for a person, or one interval as JSON.",
    ),
)
@shared_options
def top(
    options: Options,
    interval: float,
    source: str | None,
    username: str | None,
    password_file: str | None,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    insecure_skip_verify: bool,
    pod: tuple[str, str] | None,
    cgroup_path: str | None,
    sort: str,
    limit: int,
    threads: bool,
    output_format: str,
) -> None:
    """Show which processes wait, live: the node's, a pod's or a cgroup's.

    For a pod or a cgroup, its own cgroup's CPU, throttling, pressure and run delay by
    cause above its processes. q or Ctrl-C quits.
    """
    from collector import top as view
    from collector.procfs import ProcFS

    if pod is not None and cgroup_path is not None:
        raise BadInput("--pod and --cgroup: give one of them")
    if threads and pod is None and cgroup_path is None:
        raise BadInput("--threads splits one group's processes: give --pod or --cgroup")
    selection = view.Selection(pod, cgroup_path, sort, limit or None, threads)
    try:
        procfs = ProcFS(options.procfs)
        origin: view.RemoteFeed | view.LocalFeed
        if source is not None:
            remote = view.Remote(
                source,
                username=username,
                password_file=password_file,
                ca_file=ca_file,
                cert_file=cert_file,
                key_file=key_file,
                insecure_skip_verify=insecure_skip_verify,
            )
            origin = view.RemoteFeed(remote, selection, procfs)
        else:
            engine = build_engine(options)
            node_sources(options, engine)
            origin = view.LocalFeed(engine, selection, cgroup_fields=options.cgroup)
        viewer = view.Viewer(origin, selection, view.ThreadWatch(procfs) if threads else None)
        if output_format == "json":
            view.print_json(view.one_interval(viewer, interval), sys.stdout)
        elif sys.stdout.isatty():
            view.run_live(viewer, selection, interval)
        else:
            view.run_plain(viewer, selection, interval, sys.stdout)
    except view.BadValue as error:
        raise BadInput(str(error)) from None
    except view.TopError as error:
        raise click.ClickException(str(error)) from None


@cli.command()
@_passes_group(15.0, "Seconds between passes.")
@cloup.option_group(
    "Web",
    _option(
        "--web.listen-address",
        "listen_address",
        default=":9746",
        show_default=True,
        help="Address to serve on: host:port, [v6]:port, or :port for every interface.",
    ),
    _option(
        "--web.telemetry-path",
        "telemetry_path",
        default="/metrics",
        show_default=True,
        help="Path under which to expose metrics.",
    ),
    _option(
        "--web.config.file",
        "web_config_file",
        default=None,
        callback=_not_empty,
        help="TLS and basic auth, in the Prometheus exporter-toolkit web configuration format.",
    ),
    _option(
        "--web.max-requests",
        "max_requests",
        type=click.IntRange(min=0),
        default=40,
        show_default=True,
        help="Requests answered at once; one more is answered 503 at once. 0: no bound "
        "but the connections' (4096).",
    ),
    _option(
        "--web.processes/--no-web.processes",
        "processes",
        default=True,
        show_default=True,
        help="Serve /processes: each process's delta of the last pass, with its PID and "
        "16-byte name (never its command line), to whoever may scrape.",
    ),
    _option(
        "--web.processes.storage-bytes/--no-web.processes.storage-bytes",
        "storage_bytes",
        default=False,
        show_default=True,
        help="Serve each process's storage bytes in /processes to every client, not only "
        "to those --web.config.file authenticates (the kernel shows /proc/<pid>/io to its "
        "owner alone).",
    ),
)
@shared_options
def serve(
    options: Options,
    interval: float,
    listen_address: str,
    telemetry_path: str,
    web_config_file: str | None,
    max_requests: int,
    processes: bool,
    storage_bytes: bool,
) -> None:
    """Serve the per-pod counters to Prometheus, on /metrics and /healthz.

    A pass every INTERVAL seconds in the background; a scrape reads the last one's page.
    """
    from collector import webconfig
    from collector.exporter import CannotBind, ListenAddressError
    from collector.serving import ServeSettings, run_serve

    try:
        web = webconfig.WebConfigFile(web_config_file) if web_config_file else None
    except webconfig.WebConfigError as error:
        raise BadInput(f"--web.config.file {error}") from None

    if not telemetry_path.startswith("/") or telemetry_path in ("/", "/healthz", "/processes"):
        raise BadInput(
            f"--web.telemetry-path {telemetry_path!r}: want an absolute path other than "
            "/, /healthz and /processes"
        )
    settings = ServeSettings(
        options=options,
        interval=interval,
        listen_address=listen_address,
        telemetry_path=telemetry_path,
        web=web,
        max_requests=max_requests,
        processes=processes,
        storage_bytes=storage_bytes,
    )
    try:
        run_serve(settings)
    except CannotBind as error:  # a right address the host refuses: in use, say
        raise click.ClickException(f"--web.listen-address {error}") from None
    except ListenAddressError as error:
        raise BadInput(f"--web.listen-address {error}") from None


@cli.command()
@cloup.option_group(
    "Measurement",
    click.option(
        "--rounds",
        type=click.IntRange(min=3),
        default=15,
        show_default=True,
        help="Interleaved rounds per table.",
    ),
    click.option(
        "--pause",
        type=float,
        default=0.3,
        show_default=True,
        help="Seconds between rounds (busy threads move meanwhile).",
    ),
    click.option("--quick", is_flag=True, help="Only the N=200 tables; no RSS run."),
)
@cloup.option_group(
    "Report",
    click.option(
        "--output",
        type=click.Path(dir_okay=False, writable=True),
        help="Also write the report there, as Markdown (the project keeps docs/bench.md).",
    ),
)
def bench(rounds: int, pause: float, quick: bool, output: str | None) -> None:
    """Measure what a pass and the served process cost (needs root).

    Against a naive floor, on synthetic process tables; and the page's weight per pod for
    each switch.
    """
    try:
        from collector import bench as benchmark
    except ModuleNotFoundError as error:  # the bench extra is not installed
        raise click.ClickException(
            f"bench needs {error.name}, which the collector does not: "
            "pip install 'procdelta[bench]'"
        ) from None

    benchmark.run(rounds, pause, quick, click.echo, output)


def error_line(error: click.ClickException) -> str:
    """The one line an error prints. A bad value names where it came from: the flag the
    user typed, or the environment variable that set it (click names both either way)."""
    if isinstance(error, click.BadParameter) and error.param is not None and error.ctx:
        param = error.param
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        source = error.ctx.get_parameter_source(param.name)
        if source is click.core.ParameterSource.ENVIRONMENT:
            envvar = param.envvar if isinstance(param.envvar, str) else _env(flag)
            where = f"{envvar} (for {flag})"
        else:
            where = flag
        return f"{where}: {error.message}"
    return error.format_message()


def main(argv: list[str] | None = None) -> None:
    """Entry point: click's errors become one line on stderr and a non-zero exit (2: the
    invocation is wrong; 1: the work could not be done; docs/operating.md)."""
    try:
        code = cli.main(args=argv, prog_name="procdelta", standalone_mode=False)
    except click.ClickException as error:
        click.echo(f"procdelta: error: {error_line(error)}", err=True)
        sys.exit(error.exit_code)
    except (click.Abort, KeyboardInterrupt):
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(0)
    except Exception as error:  # a bug: one line for the user, the trace for --log.level debug
        log.debug("unexpected error", exc_info=True)
        click.echo(f"procdelta: error: {type(error).__name__}: {error}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)

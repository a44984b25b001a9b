"""The command line: its commands, with collector/options.py's options (the only two places
flags live). Builds the objects and runs them."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import click
import cloup

from collector import __version__
from collector.engine import Engine, PassResult
from collector.options import (
    BadInput,
    cgroup_path,
    env_name,
    not_empty,
    option,
    passes_group,
    pod_name,
    shared_options,
)
from collector.privileges import own_missing_capabilities, refused_reads
from collector.processes import DEFAULT_LIMIT, DEFAULT_SORT, MAX_LIMIT, SORT_FIELDS
from collector.wiring import Options, build_engine, node_cpus, node_sources

log = logging.getLogger("procdelta")


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
@passes_group(2.0, "Seconds between the two passes.")
@cloup.option_group(
    "Output",
    option(
        "--format",
        "output_format",
        type=click.Choice(("table", "json", "prometheus")),
        default="table",
        show_default=True,
        help="Output: a table for a person, JSON, or the /metrics exposition.",
    ),
    option(
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
@passes_group(2.0, "Seconds between refreshes (and between top's own passes).")
@cloup.option_group(
    "Source",
    option(
        "--from",
        "source",
        default=None,
        metavar="URL",
        help="Read a running `procdelta serve`'s /processes at URL (e.g. "
        "http://127.0.0.1:9746 through kubectl port-forward) instead of running passes.",
    ),
    option("--from.username", "username", default=None, help="Basic auth user for --from."),
    option(
        "--from.password-file",
        "password_file",
        default=None,
        help="File holding the basic auth password for --from.",
    ),
    option("--from.ca-file", "ca_file", default=None, help="CA certificates to trust (TLS)."),
    option(
        "--from.cert-file", "cert_file", default=None, help="Client certificate to present (TLS)."
    ),
    option("--from.key-file", "key_file", default=None, help="Key of the client certificate."),
    option(
        "--from.insecure-skip-verify",
        "insecure_skip_verify",
        is_flag=True,
        help="Do not verify the server's certificate.",
    ),
)
@cloup.option_group(
    "View",
    option(
        "--pod",
        "pod",
        default=None,
        metavar="NAMESPACE/NAME",
        callback=pod_name,
        help="Show this pod only.",
    ),
    option(
        "--cgroup",
        "cgroup_path",
        default=None,
        metavar="PATH",
        callback=cgroup_path,
        help="Show this cgroup only (its path on the host, as the cgroup label gives it).",
    ),
    option(
        "--sort",
        "sort",
        type=click.Choice(SORT_FIELDS),
        default=DEFAULT_SORT,
        show_default=True,
        help="The field to sort by, biggest first.",
    ),
    option(
        "--limit",
        "limit",
        type=click.IntRange(0, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        show_default=True,
        help="Rows to show (0: all).",
    ),
    option(
        "--threads",
        "threads",
        is_flag=True,
        help="Split the group's processes into their threads, read from --path.procfs "
        "(needs --pod or --cgroup).",
    ),
)
@cloup.option_group(
    "Output",
    option(
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
@passes_group(15.0, "Seconds between passes.")
@cloup.option_group(
    "Web",
    option(
        "--web.listen-address",
        "listen_address",
        default=":9746",
        show_default=True,
        help="Address to serve on: host:port, [v6]:port, or :port for every interface.",
    ),
    option(
        "--web.telemetry-path",
        "telemetry_path",
        default="/metrics",
        show_default=True,
        help="Path under which to expose metrics.",
    ),
    option(
        "--web.config.file",
        "web_config_file",
        default=None,
        callback=not_empty,
        help="TLS and basic auth, in the Prometheus exporter-toolkit web configuration format.",
    ),
    option(
        "--web.max-requests",
        "max_requests",
        type=click.IntRange(min=0),
        default=40,
        show_default=True,
        help="Requests answered at once; one more is answered 503 at once. 0: no bound "
        "but the connections' (4096).",
    ),
    option(
        "--web.processes/--no-web.processes",
        "processes",
        default=True,
        show_default=True,
        help="Serve /processes: each process's delta of the last pass, with its PID and "
        "16-byte name (never its command line), to whoever may scrape.",
    ),
    option(
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
            envvar = param.envvar if isinstance(param.envvar, str) else env_name(flag)
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

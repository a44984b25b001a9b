"""`procdelta serve`'s runtime, once cli.py has checked its flags: the engine and the pass
loop, the listener, the open-files limit, the interpreter's switch interval, the signals,
the threads, the start line and the stop."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass

from collector import __version__
from collector.admission import Limits
from collector.exporter import make_server
from collector.passloop import PassLoop
from collector.privileges import own_missing_capabilities
from collector.webconfig import WebConfigFile
from collector.wiring import Options, build_engine, node_cpus, node_sources

log = logging.getLogger("procdelta")

STOP_SECONDS = 5.0
"""How long `serve` may take to stop once asked (the kubelet's grace period is 30 s)."""
SIGHUP_SECONDS = 1.0
"""SIGHUPs within this of a re-read they asked for are taken together, after it."""


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """What `serve` runs with: its flags, checked."""

    options: Options
    interval: float
    listen_address: str
    telemetry_path: str
    web: WebConfigFile | None  # --web.config.file, read (None: no TLS, no basic auth)
    max_requests: int
    processes: bool  # /processes served
    storage_bytes: bool  # each process's storage bytes to every client


def run_serve(settings: ServeSettings) -> None:
    """Serve until SIGTERM or SIGINT, then exit the process (0, or 1 past STOP_SECONDS).
    Raises `exporter.CannotBind` or `exporter.ListenAddressError` before anything runs
    where the listen address cannot be served."""
    options, web = settings.options, settings.web
    engine = build_engine(options, freeze_gc=True)
    loop = PassLoop(engine, settings.interval, shapes=options.shapes, cpus=node_cpus(options))
    raise_open_files_limit()
    server = make_server(
        settings.listen_address,
        loop,
        settings.telemetry_path,
        web,
        Limits(max_requests=settings.max_requests),
        processes=settings.processes,
        cgroup_fields=options.cgroup,
        storage_bytes=settings.storage_bytes,
    )
    _log_start(settings, server.server_address)
    loop.set_sources(node_sources(options, engine))
    missing = own_missing_capabilities()
    if missing:
        log.warning(
            "running without %s: /proc/<pid>/io of processes owned by other users (or holding "
            "privileges this one lacks) cannot be read, and those processes contribute no "
            "delta; run as root, or grant %s (Kubernetes: securityContext.capabilities.add)",
            " and ".join(missing),
            ", ".join(name.removeprefix("CAP_") for name in missing),
        )
    # Passes render in a background thread; a short switch interval lets a scrape take
    # the interpreter from it within a millisecond instead of five.
    sys.setswitchinterval(0.001)
    # SIGTERM and SIGINT stop it; SIGHUP (what systemd's reload and many supervisors send)
    # re-reads --web.config.file, and is harmless without one. The handlers only say what
    # came; the main thread does it.
    wake = threading.Event()
    came: set[int] = set()

    def signalled(signum: int, _frame: object) -> None:
        came.add(signum)
        wake.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signalled)
    loop.start()
    # An idle collector wakes for its passes and its scrapes, and else only for a kept-alive
    # connection's deadline: the HTTP event loop sleeps until a socket or a deadline needs
    # it, the main thread until a signal.
    serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    serving.start()
    reload_at = 0.0  # SIGHUPs re-read the file at most once a second: a storm, once
    while not came & {signal.SIGTERM, signal.SIGINT}:
        hup_waits = signal.SIGHUP in came
        wake.wait(max(0.0, reload_at - time.monotonic()) if hup_waits else None)
        wake.clear()
        if signal.SIGHUP in came and time.monotonic() >= reload_at:
            came.discard(signal.SIGHUP)
            reload_at = time.monotonic() + SIGHUP_SECONDS
            if web is None:
                log.info("SIGHUP: no --web.config.file to reload; carrying on")
            else:
                web.reload()
    log.info("stopping")
    watchdog = threading.Timer(STOP_SECONDS, _stuck_stopping)
    watchdog.daemon = True
    watchdog.start()
    server.shutdown()
    server.server_close()
    loop.stop(timeout=0.5)
    watchdog.cancel()
    # Nothing serve holds needs the interpreter's own finalization (which joins every
    # worker thread left): its logs flushed, it is done.
    logging.shutdown()
    os._exit(0)


def _log_start(settings: ServeSettings, bound: tuple) -> None:
    """The start line: the version and every setting that shapes what is served."""
    options, web = settings.options, settings.web
    current = web.current() if web is not None else None
    keys = {
        "version": __version__,
        "interval": f"{settings.interval:g}s",
        "listen": settings.listen_address,
        "bound": f"{bound[0]}:{bound[1]}",
        "tls": bool(current and current.tls),
        "basic_auth": bool(current and current.users),
        "max_requests": settings.max_requests,
        "processes": settings.processes,
        "storage_bytes": settings.storage_bytes or bool(current and current.authenticates),
        "telemetry_path": settings.telemetry_path,
        "procfs": options.procfs,
        "cgroupfs": options.cgroupfs,
        "pod_logs": options.pod_logs,
        "container_logs": options.container_logs,
        "per_container": options.per_container,
        "pods_only": options.pods_only,
        "cgroup": options.cgroup,
        "pressure": options.pressure,
        "interval_gauges": options.interval_gauges,
        "totals": options.totals,
    }
    log.info("starting procdelta", extra={"keys": keys})


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one, as Go's runtime does for every
    exporter: the listener's connections are bounded by its own rules, not by a soft
    limit of 1024 that a few idle clients would exhaust."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _stuck_stopping() -> None:
    """`serve` did not stop within STOP_SECONDS: say so with every thread's stack (what
    held it, for a bug report), and exit all the same."""
    log.error("stopping took over %.0f s: the threads' stacks follow; exiting", STOP_SECONDS)
    logging.shutdown()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(1)

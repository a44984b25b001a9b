"""deploy/systemd: the unit's ExecStart line run as the unit runs it (a user of its own
with the unit's two capabilities), and the static_configs example Prometheus loads."""

from __future__ import annotations

import configparser
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.net import free_port, request, wait_until
from tests.promtools import binary

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(SYSTEMD / "procdelta.service")
    return parser


def capabilities(service: configparser.SectionProxy) -> list[str]:
    ambient = service["AmbientCapabilities"].split()
    assert service["CapabilityBoundingSet"].split() == ambient
    return [name.removeprefix("CAP_").lower() for name in ambient]


def test_the_units_exec_start_serves_every_process_without_root():
    """ExecStart as written (the venv's procdelta for /opt/procdelta's, and a loopback
    port for the unit's), under a non-root uid holding only the unit's capabilities and
    no new privileges: a root process's counters are read (its `io` needs both), and no
    missing privilege is said."""
    service = unit()["Service"]
    assert service["DynamicUser"] == "yes" and service["NoNewPrivileges"] == "yes"
    caps = capabilities(service)
    assert sorted(caps) == ["dac_read_search", "sys_ptrace"]
    command = shlex.split(service["ExecStart"])
    assert command[0] == "/opt/procdelta/bin/procdelta" and command[1] == "serve"
    port = free_port()
    binary = str(Path(sys.executable).parent / "procdelta")
    as_the_unit = [
        "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs",
        "--inh-caps=" + ",".join(f"+{c}" for c in caps),
        "--ambient-caps=" + ",".join(f"+{c}" for c in caps),
        "--bounding-set=-all," + ",".join(f"+{c}" for c in caps),
    ]  # fmt: skip
    root_sleeper = subprocess.Popen(["sleep", "300"])
    serve = subprocess.Popen(
        [*as_the_unit, binary, *command[1:],
         "--web.listen-address", f"127.0.0.1:{port}", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def listed():
            document = json.loads(request(port, "/processes?limit=0")[2])
            return [p for p in document["processes"] if p["pid"] == root_sleeper.pid]

        (row,) = wait_until(listed, 30, "the root process listed")
        assert row["comm"] == "sleep"
        page = request(port, "/metrics")[2].decode()
        assert "procdelta_build_info" in page
    finally:
        root_sleeper.kill()
        root_sleeper.wait(10)
        serve.terminate()
        _, log = serve.communicate(timeout=10)
    assert serve.returncode == 0, log
    assert "lacks" not in log and "running without" not in log, log
    assert "level=info" in log and "starting procdelta" in log


def test_the_static_configs_example_loads_with_the_shipped_rules(tmp_path):
    shutil.copy(SYSTEMD / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(ROOT / "deploy" / "prometheus" / "procdelta.rules.yml", tmp_path)
    result = subprocess.run(
        [binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr

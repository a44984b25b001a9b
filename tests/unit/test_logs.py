"""The log lines (collector/logs.py): logfmt as the Prometheus exporters write it, JSON
with the same keys, a record's own keys after the message."""

from __future__ import annotations

import json
import logging

import pytest

from collector import logs


def record(msg: str, *args, keys: dict | None = None, exc_info=None) -> logging.LogRecord:
    made = logging.LogRecord("procdelta", logging.WARNING, __file__, 1, msg, args, exc_info)
    made.created, made.msecs = 1764680577.278, 278.0
    if keys is not None:
        made.keys = keys
    return made


def test_a_logfmt_line_has_its_keys_in_order_and_quotes_only_what_it_must():
    line = logs.LogfmtFormatter().format(record("cannot read %s", "/proc/1/io"))
    assert line == (
        'time=2025-12-02T13:02:57.278Z level=warn source=procdelta msg="cannot read /proc/1/io"'
    )
    line = logs.LogfmtFormatter().format(record('a "quoted"\nline=x\\'))
    assert line.endswith(r'msg="a \"quoted\"\nline=x\\"') and "\n" not in line
    assert logs.logfmt_value("") == '""' and logs.logfmt_value("plain") == "plain"


def test_a_records_own_keys_follow_the_message_as_keys_booleans_as_go_writes_them():
    """node_exporter's start line carries `version=` as a key, not inside `msg`."""
    keys = {"version": "1.2.3", "interval": "15s", "tls": True, "basic_auth": False,
            "telemetry_path": "/metrics x"}  # fmt: skip
    line = logs.LogfmtFormatter().format(record("starting procdelta", keys=keys))
    assert line.endswith(
        'msg="starting procdelta" version=1.2.3 interval=15s tls=true basic_auth=false '
        'telemetry_path="/metrics x"'
    )
    fields = json.loads(logs.JSONFormatter().format(record("starting procdelta", keys=keys)))
    assert list(fields) == ["time", "level", "source", "msg", *keys]
    assert fields["msg"] == "starting procdelta" and fields["tls"] == "true"


def test_an_error_carries_its_trace_under_err_on_one_line():
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        line = logs.LogfmtFormatter().format(record("failed", exc_info=sys.exc_info()))
    assert "\n" not in line and ' err="Traceback' in line and "ValueError: bad" in line


@pytest.mark.parametrize(
    ("levelno", "shown"),
    [(logging.DEBUG, "debug"), (logging.WARNING, "warn"), (logging.CRITICAL, "error")],
)
def test_levels_are_written_in_lower_case_as_the_flag_names_them(levelno, shown):
    made = logging.LogRecord("procdelta", levelno, __file__, 1, "x", (), None)
    assert f" level={shown} " in logs.LogfmtFormatter().format(made)

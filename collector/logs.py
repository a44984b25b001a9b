"""Log lines as the Prometheus exporters write them: logfmt by default, JSON on request.

`time=2026-12-02T12:42:57.278Z level=warn source=procdelta msg="..."`: one record a line,
its keys in that order, the time in UTC to the millisecond (promslog's layout, with
`--log.level`'s lowercase names), then a record's own keys (`log.info("starting procdelta",
extra={"keys": {"version": ...}})`), as node_exporter's start line carries `version=`. A
value is quoted where it holds a space, `=`, a quote or nothing, with `"`, `\\` and line
breaks escaped, so a message never breaks a line; a boolean is `true` or `false`, as Go
writes it. JSON carries the same keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("logfmt", "json")
_LEVELS = {"WARNING": "warn", "CRITICAL": "error"}
_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


def _level(record: logging.LogRecord) -> str:
    return _LEVELS.get(record.levelname, record.levelname.lower())


def _time(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, str]:
    fields = {
        "time": _time(record),
        "level": _level(record),
        "source": record.name,
        "msg": record.getMessage(),
    }
    for key, value in getattr(record, "keys", {}).items():
        fields[key] = _text(value)
    if record.exc_info:
        fields["err"] = formatter.formatException(record.exc_info)
    return fields


def _text(value: object) -> str:
    """A key's value as Go's logs write it: `true`/`false` for a boolean."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def logfmt_value(value: str) -> str:
    """A logfmt value, quoted and escaped where it must be."""
    if value and not any(c in value for c in ' ="\\\n\r\t'):
        return value
    for raw, escape in _ESCAPES:
        value = value.replace(raw, escape)
    return f'"{value}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={logfmt_value(v)}" for k, v in _fields(self, record).items())


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(self, record))


def configure(level: str, log_format: str = "logfmt") -> None:
    """Every record of this process to stderr, at `level` (`--log.level`) and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level == "warn" else getattr(logging, level.upper()))

"""How `cohabit serve` writes its logs, configured in one place (`configure`) for cohabit's
own loggers and uvicorn's (`uvicorn.error`, `uvicorn.access`): `text`, uvicorn's usual
lines, or `json`, one object per line on stderr for a log collector:

    {"time": "2026-12-01T03:15:02.120Z", "level": "INFO", "logger": "uvicorn.access",
     "message": "127.0.0.1:51234 - \\"GET /api/ping HTTP/1.1\\" 200", "client": "127.0.0.1:51234",
     "method": "GET", "path": "/api/ping", "status": 200}

`exception` holds the traceback's text when a record carries one.
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

SERVE_LOGGER = "cohabit.serve"  # the server's own notices, shown at any --log-level
_ACCESS_LOGGER = "uvicorn.access"
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")  # uvicorn's args


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601, milliseconds), level, logger,
    message, and `exception` when the record carries one; an access line also gets its
    request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        args = record.args
        if record.name == _ACCESS_LOGGER and isinstance(args, tuple) and len(args) == 5:
            entry.update(zip(_ACCESS_FIELDS, args, strict=True))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def logging_config(log_format: LogFormat, level: LogLevel) -> dict[str, Any]:
    """The `logging.config.dictConfig` document for a format and a level."""
    if log_format is LogFormat.JSON:
        json_formatter = {"()": f"{__name__}.JsonFormatter"}
        formatters: dict[str, Any] = {"default": json_formatter, "access": json_formatter}
    else:
        formatters = {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s %(name)s: %(message)s",
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            },
        }
    stderr = "ext://sys.stderr"
    numeric = level.value.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": formatters,
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": stderr},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": stderr},
        },
        "root": {"handlers": ["default"], "level": numeric},
        "loggers": {
            # uvicorn's loggers write through the root's handler (one stream, one format).
            "uvicorn": {"handlers": [], "level": numeric, "propagate": True},
            "uvicorn.error": {"level": numeric},
            _ACCESS_LOGGER: {"handlers": ["access"], "level": numeric, "propagate": False},
            SERVE_LOGGER: {"level": "INFO"},
        },
    }


def configure(log_format: LogFormat, level: LogLevel) -> None:
    """Set up logging for the whole process (before uvicorn starts; uvicorn is then given
    no log config of its own)."""
    logging.config.dictConfig(logging_config(log_format, level))

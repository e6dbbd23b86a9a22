"""Settings of one `cohabit serve` process: where data lives, which database, how to listen,
the API token (or, without one, the host names answered) and the reconciler's pace. Read from
options first, then COHABIT_* variables."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from cohabit.store.database import sqlite_url
from cohabit.units import GIB, MIB, parse_size

DEFAULT_PORT = 8420
LOOPBACK = "127.0.0.1"
# How long an idle HTTP connection stays open. Longer than any published client polls (the
# kamiwaza client every 5 s) and than the 60 s idle timeout load balancers commonly use, so
# the side that closes an idle connection is the client's or the proxy's, never ours while
# a request is on its way (uvicorn's own default is 5 s).
KEEP_ALIVE_S = 65


_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
_HOST_NAME = re.compile(r"[a-z0-9._:-]+")


def _token(value: str) -> str:
    """A bearer token travels in a header: visible ASCII only (RFC 9110 field values; RFC
    6750's b64token is a subset), so every client sends the same bytes for it."""
    if not _VISIBLE_ASCII.fullmatch(value):
        raise ValueError("the API token must be visible ASCII characters (no spaces or accents)")
    return value


def _host_name(value: str) -> str:
    """A name a Host header may carry (DNS name or IP literal), without port or brackets."""
    name = value.strip().lower()
    if not _HOST_NAME.fullmatch(name) or len(name) > 253:
        raise ValueError(f"{value!r} is not a host name (letters, digits, '.', '-', ':')")
    return name


Token = Annotated[str, AfterValidator(_token)]
Size = Annotated[int, BeforeValidator(parse_size)]  # bytes, or a string with a unit
HostName = Annotated[str, AfterValidator(_host_name)]


# Settings of the HTTP edge read from COHABIT_<NAME> (upper case) by `Settings.from_env`.
_EDGE_SETTINGS = (
    "max_body_bytes",
    "max_gateway_body_bytes",
    "head_timeout_s",
    "body_timeout_s",
    "max_connections",
    "shutdown_timeout_s",
)


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cohabit"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None  # None: SQLite file in data_dir
    host: str = LOOPBACK
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    token: Token | None = None
    # Opens /metrics alone, for a scraper that should not hold an API token.
    metrics_token: Token | None = None
    allowed_hosts: tuple[HostName, ...] = ()  # answered without a token, beside loopback
    fleet_file: Path | None = None
    poll_interval_s: float = Field(default=0.5, gt=0)
    lease_s: float = Field(default=15.0, gt=0)
    startup_timeout_s: float | None = Field(default=None, gt=0)
    # Local engines: vLLM sized by --kv-cache-memory-bytes where a config does not choose,
    # and HAMi-core's library preloaded into NVIDIA engines (None: no hard limit).
    vllm_kv_cache_bytes: bool = False
    hard_limit_library: str | None = None
    # Local engines start from a pre-imported launcher per Python engine (runtime/forkserver.py).
    preimport_engines: bool = True
    keep_alive_s: int = Field(default=KEEP_ALIVE_S, ge=1)
    # The HTTP edge (service/api/limits.py, service/httpserver.py): the largest request body an
    # /api route and a gateway route read, how long a request's head and then its body may
    # take to arrive, how many connections are held open at once (fewer when the open-files
    # limit leaves less), and how long a shutdown waits for answers still going out.
    max_body_bytes: Size = Field(default=MIB, ge=1024)
    max_gateway_body_bytes: Size = Field(default=32 * MIB, ge=1024)
    head_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    max_connections: int = Field(default=4096, ge=8, le=1_000_000)
    shutdown_timeout_s: int = Field(default=10, ge=0, le=3600)  # uvicorn takes whole seconds
    # The gateway: how often its route table is read again (the most a change made by
    # another server process takes to show), and how long a request for a deployment that
    # has no engine serving is held while it loads before a 503.
    route_refresh_s: float = Field(default=0.5, gt=0, le=60)
    gateway_wait_s: float = Field(default=120.0, ge=0, le=3600)
    # Ended deployments older than this are purged with their logs; 0 keeps them forever.
    retention_days: float = Field(default=7.0, ge=0, le=36_500)
    # The meter: seconds between memory samples (0: off), memory kept free beside what the
    # devices report free, and how far above its budget an engine may go before it is over.
    meter_interval_s: float = Field(default=5.0, ge=0)
    memory_headroom_bytes: Size = Field(default=GIB, ge=0)
    over_budget_tolerance_fraction: float = Field(default=0.1, ge=0, le=10)
    # Autoscaling (service/control/autoscale.py): requests in flight per ready copy above which
    # a copy is added, how long the load must stay above (or below) first, and the pause after each
    # decision.
    scale_per_copy: int = Field(default=4, ge=1, le=10_000)
    scale_window_s: float = Field(default=30.0, ge=0, le=3600)
    scale_cooldown_s: float = Field(default=60.0, ge=0, le=86_400)
    # The warm tier (service/control/warm.py): a scale-to-zero vLLM deployment on an NVIDIA GPU
    # sleeps when idle instead of unloading (False: it unloads, as every other engine does).
    idle_sleep: bool = True

    @classmethod
    def from_env(cls, **given: object) -> Settings:
        """Options given win; unset ones fall back to COHABIT_DATA_DIR, COHABIT_DATABASE_URL,
        COHABIT_API_TOKEN, COHABIT_METRICS_TOKEN, COHABIT_ALLOWED_HOSTS (comma-separated),
        COHABIT_STARTUP_TIMEOUT_S, COHABIT_RETENTION_DAYS, COHABIT_LEASE_S,
        COHABIT_PREIMPORT_ENGINES (0 turns the pre-imported launchers off) and the HTTP edge's
        COHABIT_MAX_BODY_BYTES, COHABIT_MAX_GATEWAY_BODY_BYTES (sizes such as 4MiB),
        COHABIT_HEAD_TIMEOUT_S, COHABIT_BODY_TIMEOUT_S, COHABIT_MAX_CONNECTIONS and
        COHABIT_SHUTDOWN_TIMEOUT_S, then to the defaults."""
        hosts = os.environ.get("COHABIT_ALLOWED_HOSTS", "")
        env = {
            "data_dir": os.environ.get("COHABIT_DATA_DIR"),
            "database_url": os.environ.get("COHABIT_DATABASE_URL"),
            "token": os.environ.get("COHABIT_API_TOKEN"),
            "metrics_token": os.environ.get("COHABIT_METRICS_TOKEN"),
            "allowed_hosts": tuple(name.strip() for name in hosts.split(",") if name.strip()),
            "startup_timeout_s": os.environ.get("COHABIT_STARTUP_TIMEOUT_S"),
            "retention_days": os.environ.get("COHABIT_RETENTION_DAYS"),
            "lease_s": os.environ.get("COHABIT_LEASE_S"),
            "idle_sleep": os.environ.get("COHABIT_IDLE_SLEEP"),
            "preimport_engines": os.environ.get("COHABIT_PREIMPORT_ENGINES"),
            **{name: os.environ.get(f"COHABIT_{name.upper()}") for name in _EDGE_SETTINGS},
        }
        values: dict[str, object] = {key: value for key, value in env.items() if value}
        values |= {key: value for key, value in given.items() if value is not None}
        return cls.model_validate(values)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or sqlite_url(self.data_dir)

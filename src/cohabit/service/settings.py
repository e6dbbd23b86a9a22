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
from cohabit.units import GIB, parse_size

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
    keep_alive_s: int = Field(default=KEEP_ALIVE_S, ge=1)
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

    @classmethod
    def from_env(cls, **given: object) -> Settings:
        """Options given win; unset ones fall back to COHABIT_DATA_DIR, COHABIT_DATABASE_URL,
        COHABIT_API_TOKEN, COHABIT_METRICS_TOKEN, COHABIT_ALLOWED_HOSTS (comma-separated),
        COHABIT_STARTUP_TIMEOUT_S and COHABIT_RETENTION_DAYS, then to the defaults."""
        hosts = os.environ.get("COHABIT_ALLOWED_HOSTS", "")
        env = {
            "data_dir": os.environ.get("COHABIT_DATA_DIR"),
            "database_url": os.environ.get("COHABIT_DATABASE_URL"),
            "token": os.environ.get("COHABIT_API_TOKEN"),
            "metrics_token": os.environ.get("COHABIT_METRICS_TOKEN"),
            "allowed_hosts": tuple(name.strip() for name in hosts.split(",") if name.strip()),
            "startup_timeout_s": os.environ.get("COHABIT_STARTUP_TIMEOUT_S"),
            "retention_days": os.environ.get("COHABIT_RETENTION_DAYS"),
        }
        values: dict[str, object] = {key: value for key, value in env.items() if value}
        values |= {key: value for key, value in given.items() if value is not None}
        return cls.model_validate(values)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or sqlite_url(self.data_dir)

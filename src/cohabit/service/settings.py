"""Settings of one `cohabit serve` process: where data lives, which database, how to listen,
the API token and the reconciler's pace. Read from options first, then COHABIT_* variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cohabit.store.database import sqlite_url

DEFAULT_PORT = 8420
LOOPBACK = "127.0.0.1"


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cohabit"


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None  # None: SQLite file in data_dir
    host: str = LOOPBACK
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    token: str | None = None
    fleet_file: Path | None = None
    poll_interval_s: float = Field(default=0.5, gt=0)
    lease_s: float = Field(default=15.0, gt=0)
    startup_timeout_s: float | None = Field(default=None, gt=0)
    # Ended deployments older than this are purged with their logs; 0 keeps them forever.
    retention_days: float = Field(default=7.0, ge=0, le=36_500)

    @classmethod
    def from_env(cls, **given: object) -> Settings:
        """Options given win; unset ones fall back to COHABIT_DATA_DIR, COHABIT_DATABASE_URL,
        COHABIT_API_TOKEN, COHABIT_STARTUP_TIMEOUT_S and COHABIT_RETENTION_DAYS, then to the
        defaults."""
        env = {
            "data_dir": os.environ.get("COHABIT_DATA_DIR"),
            "database_url": os.environ.get("COHABIT_DATABASE_URL"),
            "token": os.environ.get("COHABIT_API_TOKEN"),
            "startup_timeout_s": os.environ.get("COHABIT_STARTUP_TIMEOUT_S"),
            "retention_days": os.environ.get("COHABIT_RETENTION_DAYS"),
        }
        values: dict[str, object] = {key: value for key, value in env.items() if value}
        values |= {key: value for key, value in given.items() if value is not None}
        return cls.model_validate(values)

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or sqlite_url(self.data_dir)

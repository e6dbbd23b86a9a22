"""Settings: options given win over the environment, which wins over the defaults; a bad
value from either is a validation error naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cohabit.service.settings import Settings


@pytest.mark.parametrize(
    ("env", "given", "expected"),
    [
        ({}, {}, None),
        ({"COHABIT_STARTUP_TIMEOUT_S": "900"}, {}, 900.0),
        ({"COHABIT_STARTUP_TIMEOUT_S": "900"}, {"startup_timeout_s": 30.0}, 30.0),
    ],
    ids=["default-per-engine", "from-environment", "option-wins"],
)
def test_startup_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict, given: dict, expected: float | None
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings.from_env(data_dir=tmp_path, **given)
    assert settings.startup_timeout_s == expected


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_bad_startup_timeout_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("COHABIT_STARTUP_TIMEOUT_S", value)
    with pytest.raises(ValidationError, match="startup_timeout_s"):
        Settings.from_env(data_dir=tmp_path)


@pytest.mark.parametrize(
    ("env", "given", "expected"),
    [
        ({}, {}, 7.0),
        ({"COHABIT_RETENTION_DAYS": "30"}, {}, 30.0),
        ({"COHABIT_RETENTION_DAYS": "30"}, {"retention_days": 0.0}, 0.0),
    ],
    ids=["a-week", "from-environment", "option-wins-zero-keeps-all"],
)
def test_retention(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict, given: dict, expected: float
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Settings.from_env(data_dir=tmp_path, **given).retention_days == expected


@pytest.mark.parametrize("value", ["forever", "-1", "nan"])
def test_bad_retention_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("COHABIT_RETENTION_DAYS", value)
    with pytest.raises(ValidationError, match="retention_days"):
        Settings.from_env(data_dir=tmp_path)

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


@pytest.mark.parametrize(
    ("variable", "value", "setting", "expected"),
    [
        ("COHABIT_MAX_BODY_BYTES", "4MiB", "max_body_bytes", 4 * 1024 * 1024),
        ("COHABIT_MAX_GATEWAY_BODY_BYTES", "65536", "max_gateway_body_bytes", 65536),
        ("COHABIT_HEAD_TIMEOUT_S", "2.5", "head_timeout_s", 2.5),
        ("COHABIT_BODY_TIMEOUT_S", "30", "body_timeout_s", 30.0),
        ("COHABIT_MAX_CONNECTIONS", "100", "max_connections", 100),
        ("COHABIT_SHUTDOWN_TIMEOUT_S", "0", "shutdown_timeout_s", 0),
    ],
)
def test_the_edges_limits_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    variable: str,
    value: str,
    setting: str,
    expected: object,
) -> None:
    monkeypatch.setenv(variable, value)
    assert getattr(Settings.from_env(data_dir=tmp_path), setting) == expected


@pytest.mark.parametrize(
    ("variable", "value", "setting"),
    [
        ("COHABIT_MAX_BODY_BYTES", "lots", "max_body_bytes"),
        ("COHABIT_MAX_BODY_BYTES", "10", "max_body_bytes"),  # below 1 KiB: nothing fits
        ("COHABIT_HEAD_TIMEOUT_S", "0", "head_timeout_s"),
        ("COHABIT_MAX_CONNECTIONS", "2", "max_connections"),
        ("COHABIT_SHUTDOWN_TIMEOUT_S", "-1", "shutdown_timeout_s"),
    ],
)
def test_bad_edge_limits_from_the_environment_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str, setting: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=setting):
        Settings.from_env(data_dir=tmp_path)


@pytest.mark.parametrize(("value", "expected"), [(None, 15.0), ("600", 600.0)])
def test_the_lease_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None, expected: float
) -> None:
    if value is not None:
        monkeypatch.setenv("COHABIT_LEASE_S", value)
    assert Settings.from_env(data_dir=tmp_path).lease_s == expected


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_lease_from_the_environment_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("COHABIT_LEASE_S", value)
    with pytest.raises(ValidationError, match="lease_s"):
        Settings.from_env(data_dir=tmp_path)

"""`cohabit tokens create|ls|revoke`, run as a user runs them (subprocesses) against a real
`cohabit serve --token`: the secret is printed once and works, a user token may read but
not mint, a revoked one is refused, and mistakes are one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.cli.test_serve import T4, cohabit_serve
from tests.conftest import run_cli

BOOTSTRAP = "b00tstrap-0f-16-chars"
MISTAKES = [
    (["tokens", "create", "x", "--role", "root"], "role"),
    (["tokens", "create", "x", "--ttl", "0"], "--ttl"),
    (["tokens", "revoke", "nobody"], "token nobody not found"),
]


@pytest.mark.slow
def test_create_list_use_revoke_and_mistakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cohabit_serve(tmp_path, T4, "--token", BOOTSTRAP) as (api, _process):
        monkeypatch.setenv("COHABIT_BASE_URL", api)
        monkeypatch.setenv("COHABIT_API_TOKEN", BOOTSTRAP)

        created = run_cli("tokens", "create", "ci", "--ttl", "3600")
        assert created.returncode == 0, created.stderr
        token = created.stdout.strip()
        assert token.startswith("cohabit_") and "\n" not in token
        assert "'ci' (user, expires" in created.stderr and "not shown again" in created.stderr
        me = httpx.get(f"{api}/auth/users/me", headers={"Authorization": f"Bearer {token}"})
        assert me.json()["username"] == "ci" and me.json()["roles"] == ["user"]

        admin = json.loads(run_cli("tokens", "create", "ops", "--role", "admin", "--json").stdout)
        assert admin["pat"]["role"] == "admin"

        listed = run_cli("tokens", "ls")
        assert listed.returncode == 0, listed.stderr
        assert token not in listed.stdout and admin["token"] not in listed.stdout
        lines = [line.split() for line in listed.stdout.splitlines()]
        rows = {cells[1]: cells for cells in lines if len(cells) > 5 and cells[0] != "ID"}
        assert rows["ci"][2:4] == ["user", "bootstrap"] and rows["ci"][-1] == "live"
        assert rows["ops"][2] == "admin"

        monkeypatch.setenv("COHABIT_API_TOKEN", token)
        denied = run_cli("tokens", "ls")
        assert denied.returncode == 2 and "has role user" in denied.stderr
        assert "Traceback" not in denied.stderr

        monkeypatch.setenv("COHABIT_API_TOKEN", admin["token"])
        revoked = run_cli("tokens", "revoke", "ci")
        assert revoked.returncode == 0, revoked.stderr
        me = httpx.get(f"{api}/auth/users/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 401
        for args, message in MISTAKES:
            result = run_cli(*args)
            assert result.returncode == 2, (args, result.stdout)
            assert message in result.stderr and "Traceback" not in result.stderr, result.stderr

        states = {
            t["name"]: t["revoked"] for t in json.loads(run_cli("tokens", "ls", "--json").stdout)
        }
        assert states == {"ci": True, "ops": False}


def test_a_token_less_server_says_named_tokens_need_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cohabit_serve(tmp_path, T4) as (api, _process):
        monkeypatch.setenv("COHABIT_BASE_URL", api)
        monkeypatch.delenv("COHABIT_API_TOKEN", raising=False)
        result = run_cli("tokens", "create", "ci")
    assert result.returncode == 2
    assert "start it with --token" in result.stderr

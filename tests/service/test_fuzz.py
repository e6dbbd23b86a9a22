"""Schemathesis against a live server on a loopback port (real HTTP, SQLite, the T4 fleet, the
scripted engine double), with and without a token: every /api operation its OpenAPI document
lists, with generated valid and invalid input, must answer no 5xx and only what the document
says (status codes, content types, headers, body schemas); with a token, none may ignore it.
A model and a DEPLOYED deployment are there first, so list answers carry real records.
Each run is bounded in time (`FUZZ_SECONDS`), seeded, and reported by its reproducers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.service.access.guard import OPEN_PATHS
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import deploy, register_tiny_gguf, serving, settings_for, wait_status

# A minute each, two minutes in all: schemathesis spends the first part on its coverage phase,
# and under `make test` another worker shares the CPU, so less left the fuzzing phase too
# little time to reach every operation twice.
FUZZ_SECONDS = 60
SEED = 20261201
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)


@pytest.mark.slow
@pytest.mark.timeout(FUZZ_SECONDS * 3)
@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_fuzzing_the_api_finds_no_5xx_and_no_contract_violation(
    tmp_path: Path, token: str | None
) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'fuzz.db'}", token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with serving(settings, ScriptedRuntime()) as api:
        with httpx.Client(base_url=api, timeout=30, headers=headers) as client:
            model = register_tiny_gguf(client, tmp_path)
            deployed = deploy(client, model["id"], vram_allocation=GIB)
            assert wait_status(client, deployed.json())["status"] == "DEPLOYED"
            operations = _api_operations(client.get("/openapi.json").json())
        checks = CHECKS + (("ignored_auth",) if token else ())
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{api}/openapi.json",
            f"--checks={','.join(checks)}",
            "--exclude-tag=gateway",  # the OpenAI routes: their answers are the engines'
            # The Hub's routes: with no Hub reachable here they answer a documented 503;
            # tests/hub drive them against a stand-in of the Hub.
            "--exclude-tag=hub",
            f"--max-time={FUZZ_SECONDS}",
            "--max-examples=25",
            f"--seed={SEED}",
            "--generation-database=none",
            "--no-color",
        ]
        if token:
            command.append(f"--header=Authorization: Bearer {token}")
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=FUZZ_SECONDS * 2,
            check=False,
        )
    report = result.stdout[-8000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts is not None, report
    generated, passed = map(int, counts.groups())
    assert f"Tested: {operations}" in result.stdout, report
    assert generated >= 2 * operations and passed == generated, report


def _api_operations(document: dict[str, Any]) -> int:
    """How many operations the fuzzer must reach: all but the gateway's and the Hub's."""
    return sum(
        not {"gateway", "hub"} & set(operation.get("tags", []))
        for methods in document["paths"].values()
        for operation in methods.values()
    )


@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_the_document_names_the_errors_each_route_can_answer(
    tmp_path: Path, token: str | None
) -> None:
    """What the fuzzer holds the server to must be there to hold: 401/403 on every guarded
    route, 404 where an id is looked up, 400/422 where a body is read, 409 on deploy, and the
    bearer scheme exactly when the server has a token."""
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'doc.db'}", token=token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with serving(settings, ScriptedRuntime()) as api:
        document = httpx.get(f"{api}/openapi.json", headers=headers, timeout=60).json()
    schemes = document["components"].get("securitySchemes", {})
    assert (schemes.get("bearer", {}).get("scheme") == "bearer") is bool(token)
    for path, methods in document["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in methods.items():
            codes = set(operation["responses"])
            open_route = path in OPEN_PATHS
            assert ("403" in codes) and (open_route or "401" in codes), (method, path)
            if token:
                assert operation["security"] == ([] if open_route else [{"bearer": []}])
            if "{" in path or "requestBody" in operation:
                assert "404" in codes or path == "/api/models/", (method, path)
            if "requestBody" in operation:
                assert {"400", "422"} <= codes, (method, path)
            if path == "/api/serving/deploy_model":
                assert "409" in codes

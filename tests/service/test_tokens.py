"""Named API tokens over real HTTP: only their SHA-256 is stored, roles are enforced on every
route that deploys, stops, deletes or manages tokens, revoked and expired tokens are refused,
and the password grant takes a token. Engines are the in-process double."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from cohabit.service.access.throttle import MAX_FAILURES, WINDOW_S
from cohabit.store.database import Database, sqlite_url
from cohabit.store.tables import ApiTokenRow
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for

TOKEN = "s3cret"
SOME_ID = "00000000-0000-0000-0000-000000000001"


_OPEN: list[httpx.Client] = []


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[tuple[str, str]]:
    """One server per database kind for the module; tests name their tokens apart."""
    settings = settings_for(tmp_path_factory.mktemp("tokens"), module_database_url, token=TOKEN)
    with serving(settings, ScriptedRuntime()) as url:
        try:
            yield url, module_database_url
        finally:
            while _OPEN:
                _OPEN.pop().close()


@pytest.fixture
def api(served: tuple[str, str]) -> str:
    return served[0]


def client(api: str, token: str | None = TOKEN) -> httpx.Client:
    """A client sending `token` (None: no header); closed when the module's server stops."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    _OPEN.append(httpx.Client(base_url=api, headers=headers, timeout=30))
    return _OPEN[-1]


def mint(api: str, name: str, **params: Any) -> dict[str, Any]:
    response = client(api).post("/auth/pats", params={"name": name, **params})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def test_only_the_digest_is_stored(served: tuple[str, str]) -> None:
    api, database_url = served
    created = mint(api, "digest", role="admin")
    token = created["token"]
    db = Database(database_url)
    try:
        with db.read() as session:
            rows = session.scalars(select(ApiTokenRow)).all()
            stored = [str(getattr(r, c.name)) for r in rows for c in ApiTokenRow.__table__.columns]
            (row,) = [r for r in rows if r.id == created["pat"]["jti"]]
    finally:
        db.dispose()
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert not any(token in value for value in stored)
    assert token not in client(api).get("/auth/pats").text
    assert client(api, token).get("/auth/users/me").json()["roles"] == ["admin"]


ADMIN_ROUTES = [
    ("POST", "/serving/deploy_model"),
    ("DELETE", f"/serving/deployment/{SOME_ID}"),
    ("POST", "/models/"),
    ("DELETE", f"/models/{SOME_ID}"),
    ("POST", "/model_configs/"),
    ("PUT", f"/model_configs/{SOME_ID}"),
    ("DELETE", f"/model_configs/{SOME_ID}"),
    ("POST", "/auth/pats"),
    ("GET", "/auth/pats"),
    ("DELETE", f"/auth/pats/{SOME_ID}"),
]
READ_ROUTES = [
    "/serving/deployments",
    "/models/",
    "/model_configs/",
    "/model_files/",
    "/cluster/hardware",
    "/auth/users/me",
]


def test_a_user_token_reads_but_is_refused_what_changes_the_server(api: str) -> None:
    user = client(api, mint(api, "reader")["token"])
    for method, path in ADMIN_ROUTES:
        response = user.request(method, path, json={}, params={"name": "x"})
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["detail"].startswith("token 'reader' has role user")
    for path in READ_ROUTES:
        assert user.get(path).status_code == 200, path
    estimate = user.post("/serving/estimate_model_vram", json={"m_id": SOME_ID})
    # Read-only POSTs are a user's: this one names no model, so nothing could be estimated.
    assert (estimate.status_code, estimate.json()["estimation_source"]) == (200, "unavailable")
    maker = user.post(api.removesuffix("/api") + "/ui/context-config", json={})  # web page's
    assert maker.status_code == 403, maker.text
    gateway = api.removesuffix("/api") + "/v1/models"  # chat goes through the gateway
    assert user.get(gateway).json()["object"] == "list"
    assert client(api, None).get(gateway).status_code == 401


def test_revoked_and_expired_tokens_are_refused(api: str) -> None:
    revoked = mint(api, "gone")
    assert client(api).delete("/auth/pats/gone").json() == {
        "jti": revoked["pat"]["jti"],
        "revoked": True,
    }
    answer = client(api, revoked["token"]).get("/serving/deployments")
    assert answer.status_code == 401 and "was revoked" in answer.json()["detail"]

    brief = mint(api, "brief", ttl_seconds=1)
    assert client(api, brief["token"]).get("/auth/users/me").status_code == 200
    time.sleep(1.2)
    answer = client(api, brief["token"]).get("/auth/users/me")
    assert answer.status_code == 401 and "expired" in answer.json()["detail"]
    assert client(api).get("/serving/deployments").status_code == 200  # bootstrap unaffected


BAD_REQUESTS = [
    ({"name": "twice"}, 409, "already named 'twice'"),
    ({"name": "x", "role": "root"}, 422, "role"),
    ({"name": "x", "ttl_seconds": 0}, 422, "ttl_seconds"),
    ({"name": " "}, 422, "name"),
    ({}, 422, "name"),
    ({"name": "bootstrap"}, 422, "'bootstrap' is reserved"),
    ({"name": "Anonymous", "role": "admin"}, 422, "'Anonymous' is reserved"),
]


def test_bad_token_requests_are_4xx_and_change_nothing(api: str) -> None:
    mint(api, "twice")
    before = client(api).get("/auth/pats").json()["pats"]
    for params, status, needle in BAD_REQUESTS:
        answer = client(api).post("/auth/pats", params=params)
        assert answer.status_code == status and needle in answer.text, (params, answer.text)
    assert client(api).get("/auth/pats").json()["pats"] == before


def test_revoking_an_unknown_token_is_404(api: str) -> None:
    assert client(api).delete(f"/auth/pats/{SOME_ID}").status_code == 404


def test_password_grant(api: str) -> None:
    anonymous = client(api, None)
    token = mint(api, "app")["token"]
    form = anonymous.post(
        "/auth/token", data={"grant_type": "password", "username": "u", "password": token}
    )
    assert form.status_code == 200, form.text
    assert (form.json()["access_token"], form.json()["token_type"]) == (token, "bearer")
    as_json = anonymous.post("/auth/token", json={"username": "u", "password": TOKEN})
    assert as_json.json()["access_token"] == TOKEN
    wrong = anonymous.post("/auth/token", data={"username": "u", "password": "guess"})
    assert wrong.status_code == 401
    other = anonymous.post("/auth/token", data={"grant_type": "client_credentials"})
    assert other.status_code == 400 and "unsupported_grant_type" in other.text


def test_ping_and_health_are_open_and_the_rest_is_not(api: str) -> None:
    anonymous = client(api, None)
    assert anonymous.get("/ping").json()["status"] == "ok"
    assert anonymous.get("/serving/health").status_code == 200
    for path in ("/auth/users/me", "/cluster/nodes", "/model_files/"):
        assert anonymous.get(path).status_code == 401
    for header in ("Bearer", "Basic czNjcmV0", TOKEN):
        answer = anonymous.get("/auth/users/me", headers={"Authorization": header})
        assert answer.status_code == 401, header


def test_login_failures_are_throttled_per_address(tmp_path: Path) -> None:
    """Guessing a token costs time: after `MAX_FAILURES` wrong passwords from one address,
    every login from it (the right token too, which would otherwise confirm a guess) is
    429 with Retry-After until the window ends. Counted in attempts, not by the clock. A
    server of its own, so the module's server keeps its logins."""
    settings = settings_for(tmp_path, sqlite_url(tmp_path / "data"), token=TOKEN)
    with serving(settings, ScriptedRuntime()) as url, httpx.Client(base_url=url) as anonymous:
        for _ in range(MAX_FAILURES):
            wrong = anonymous.post("/auth/token", data={"password": "guess"})
            assert wrong.status_code == 401, wrong.text
        for password in ("guess", TOKEN):
            refused = anonymous.post("/auth/token", data={"password": password})
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["Retry-After"]) <= WINDOW_S
            assert "too many failed logins from 127.0.0.1" in refused.json()["detail"]
        # Only logins are throttled: the token itself still works on every route.
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert anonymous.get("/auth/users/me", headers=bearer).status_code == 200

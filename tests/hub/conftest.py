"""Hub tests: the stand-in Hub on a loopback port, pointed at through HF_ENDPOINT; the
service tests among them run on SQLite and PostgreSQL (see tests/store/databases.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hub.repos import big_repo, tiny_repo
from tests.hub.standin import StandInHub
from tests.store.databases import database_url, module_database_url

__all__ = ["database_url", "module_database_url"]


@pytest.fixture
def hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandInHub]:
    standin = StandInHub()
    standin.add(tiny_repo())
    standin.add(big_repo())
    url = standin.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield standin
    standin.stop()

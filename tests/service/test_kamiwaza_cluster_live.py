"""The published kamiwaza-sdk client (1.3.0), unchanged, against a cohabit server on a loopback
port, through what the SDK's own live tests ask beyond the read-only views: reading the
hardware again (`POST /cluster/refresh_hardware`), and the VRAM estimate for a model that is
not here. The fleet is read from a fleet file, as `cohabit serve --fleet` does; engines are
the in-process double (none starts here)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from uuid import uuid4

import pytest
from kamiwaza_sdk import KamiwazaClient
from kamiwaza_sdk.exceptions import APIError, AuthenticationError
from kamiwaza_sdk.schemas.serving.serving import CreateModelDeployment

from cohabit.hardware.fleetfile import load_fleet
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for
from tests.service.test_sdk import register

TOKEN = "s3cret"
ONE_T4 = (
    "nodes:\n  - name: node-a\n    gpus:\n"
    "      - {index: 0, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: '12.4'}\n"
)
TWO_NODES = ONE_T4 + (
    "  - name: node-b\n    gpus:\n"
    "      - {index: 0, vendor: nvidia, product: NVIDIA L4, memory: 24GiB, accel_version: '12.4'}\n"
)


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(ONE_T4)
    return path


@pytest.fixture
def api(tmp_path: Path, database_url: str, fleet_file: Path) -> Iterator[str]:
    """A server whose fleet came from `fleet_file` and is read again from it on refresh."""
    settings = settings_for(tmp_path, database_url, token=TOKEN)
    reread = partial(load_fleet, fleet_file)
    with serving(settings, ScriptedRuntime(), fleet=reread(), rediscover=reread) as url:
        yield url


@pytest.fixture
def admin(api: str) -> KamiwazaClient:
    return KamiwazaClient(base_url=api, api_key=TOKEN)


def test_refresh_hardware_reads_the_fleet_again_and_placement_sees_it(
    admin: KamiwazaClient, fleet_file: Path
) -> None:
    assert [h.name for h in admin.cluster.list_hardware()] == ["node-a"]
    fleet_file.write_text(TWO_NODES)  # a node joined since the server started
    answer = admin.post("/cluster/refresh_hardware")
    assert answer["message"] == "hardware refreshed: 2 node(s) (node-a, node-b)"
    assert [h["name"] for h in answer["hardware"]] == ["node-a", "node-b"]
    listed = admin.cluster.list_hardware()
    assert [h.name for h in listed] == ["node-a", "node-b"]
    assert len(admin.cluster.get_running_nodes()) == 2
    # The estimate's largest device is the new 24 GiB card (less nothing reserved by the OS).
    model_id = register(admin, fleet_file.parent)
    (config,) = admin.models.get_model_configs(model_id)
    estimate = admin.serving.estimate_model_vram(
        CreateModelDeployment(m_id=model_id, m_config_id=config.id)
    )
    assert estimate["highest_node_vram"] == 24 * GIB


def test_a_fleet_file_that_no_longer_reads_keeps_the_stored_fleet(
    api: str, admin: KamiwazaClient, fleet_file: Path
) -> None:
    fleet_file.write_text("nodes:\n  - name: node-a\n    gpus: [{index: 0}]\n")
    with pytest.raises(APIError) as refused:
        admin.post("/cluster/refresh_hardware")
    assert refused.value.status_code == 409
    assert "reading the fleet again failed, the stored fleet stands" in str(refused.value)
    assert str(fleet_file) in str(refused.value)
    assert [h.name for h in admin.cluster.list_hardware()] == ["node-a"]
    user = KamiwazaClient(base_url=api)  # no token: refused before anything is read
    with pytest.raises(AuthenticationError) as anonymous:
        user.post("/cluster/refresh_hardware")
    assert anonymous.value.status_code == 401


def test_a_server_handed_its_fleet_has_nothing_to_read_again(
    tmp_path: Path, database_url: str
) -> None:
    settings = settings_for(tmp_path, database_url, token=TOKEN)
    with serving(settings, ScriptedRuntime()) as api, pytest.raises(APIError) as refused:
        KamiwazaClient(base_url=api, api_key=TOKEN).post("/cluster/refresh_hardware")
    assert refused.value.status_code == 409
    assert "handed to it at start: nothing to read again" in str(refused.value)


def test_an_estimate_for_a_model_that_is_not_here_says_none_was_computed(
    admin: KamiwazaClient, tmp_path: Path
) -> None:
    """As the reference answers the SDK's live test (random ids): a dict, not an error."""
    missing = CreateModelDeployment(m_id=uuid4(), m_config_id=uuid4())
    estimate = admin.serving.estimate_model_vram(missing)
    assert estimate["estimation_source"] == "unavailable"
    assert estimate["computed_vram_estimate"] == 0.0
    assert estimate["highest_node_vram"] == 16 * GIB
    assert estimate["estimate"] is None
    assert estimate["detail"] == f"no estimate: model {missing.m_id} not found"
    # A model that is here, with a config that is not: the config is named.
    model_id = register(admin, tmp_path)
    other = CreateModelDeployment(m_id=model_id, m_config_id=uuid4())
    answer = admin.serving.estimate_model_vram(other)
    assert answer["estimation_source"] == "unavailable"
    assert str(other.m_config_id) in answer["detail"]

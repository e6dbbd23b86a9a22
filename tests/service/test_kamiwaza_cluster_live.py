"""The published kamiwaza-sdk client (1.3.0), unchanged, against a cohabit server on a loopback
port, through what the SDK's own live tests ask beyond the read-only views: reading the
hardware again (`POST /cluster/refresh_hardware`), the VRAM estimate for a model that is
not here, and the locations, clusters and hardware entries an admin registers (stored,
listed after the fleet's own, never placed on), and the federations (none). The fleet is
read from a fleet file, as `cohabit serve --fleet` does; engines are the in-process double
(none starts here)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from uuid import uuid4

import pytest
from kamiwaza_sdk import KamiwazaClient
from kamiwaza_sdk.exceptions import APIError, AuthenticationError
from kamiwaza_sdk.schemas.cluster import CreateCluster, CreateHardware, CreateLocation
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


def test_a_location_is_registered_read_changed_and_deleted(admin: KamiwazaClient) -> None:
    (fleets,) = admin.cluster.list_locations()
    created = admin.cluster.create_location(CreateLocation(name="lab", region="eu-west"))
    assert (created.name, created.region) == ("lab", "eu-west")
    assert admin.cluster.get_location(created.id) == created
    changed = admin.cluster.update_location(
        created.id, CreateLocation(name="lab-2", datacenter="dc-1")
    )
    assert (changed.id, changed.name, changed.datacenter, changed.region) == (
        created.id,
        "lab-2",
        "dc-1",
        None,  # PUT replaces: a field left out is cleared
    )
    assert [loc.id for loc in admin.cluster.list_locations()] == [fleets.id, created.id]
    admin.delete(f"/cluster/location/{created.id}")
    assert [loc.id for loc in admin.cluster.list_locations()] == [fleets.id]
    with pytest.raises(APIError) as gone:
        admin.cluster.get_location(created.id)
    assert gone.value.status_code == 404


def test_a_cluster_is_registered_at_a_location_that_cannot_go_before_it(
    admin: KamiwazaClient,
) -> None:
    (ours,) = admin.cluster.list_clusters()
    site = admin.cluster.create_location(CreateLocation(name="edge-site"))
    created = admin.cluster.create_cluster(CreateCluster(name="edge", location_id=site.id))
    assert (created.name, created.location_id) == ("edge", site.id)
    assert admin.cluster.get_cluster(created.id) == created
    listed = admin.get("/cluster/clusters")
    assert [(c["id"], c["registered"], c["node_ids"]) for c in listed] == [
        (
            str(ours.id),
            False,
            [str(n) for n in admin.get(f"/cluster/cluster/{ours.id}")["node_ids"]],
        ),
        (str(created.id), True, []),  # no nodes: placement uses this server's fleet only
    ]
    with pytest.raises(APIError) as held:
        admin.delete(f"/cluster/location/{site.id}")
    assert held.value.status_code == 409 and "'edge'" in str(held.value)
    admin.delete(f"/cluster/cluster/{created.id}")
    admin.delete(f"/cluster/location/{site.id}")
    assert [c.id for c in admin.cluster.list_clusters()] == [ours.id]
    with pytest.raises(APIError) as nowhere:
        admin.cluster.create_cluster(CreateCluster(name="lost", location_id=uuid4()))
    assert nowhere.value.status_code == 422 and "location_id" in str(nowhere.value)


def test_a_registered_hardware_entry_is_listed_but_never_placed_on(
    admin: KamiwazaClient, fleet_file: Path
) -> None:
    created = admin.cluster.create_hardware(
        CreateHardware(
            name="spare-box",
            os="Linux",
            platform="x86_64",
            gpus=[{"product": "NVIDIA A100", "memory": 80 * GIB}],
        )
    )
    assert (created.name, created.active, created.node_id) == ("spare-box", False, None)
    assert admin.cluster.get_hardware(created.id) == created
    listed = admin.get("/cluster/hardware")
    assert [(h["name"], h["registered"], h["schedulable"]) for h in listed] == [
        ("node-a", False, True),
        ("spare-box", True, False),
    ]
    assert listed[1]["slots"] == []
    # Placement still sees the T4 alone: a 20 GiB deployment fits nowhere.
    model_id = register(admin, fleet_file.parent)
    with pytest.raises(APIError) as refused:
        admin.serving.deploy_model(model_id=model_id, vram_allocation=20 * GIB, wait=False)
    assert refused.value.status_code == 409, refused.value
    admin.delete(f"/cluster/hardware/{created.id}")
    assert [h.name for h in admin.cluster.list_hardware()] == ["node-a"]


def test_the_fleets_own_entries_are_not_records_to_change(admin: KamiwazaClient) -> None:
    (node,) = admin.cluster.list_hardware()
    (cluster,) = admin.cluster.list_clusters()
    (location,) = admin.cluster.list_locations()
    for path in (
        f"/cluster/hardware/{node.id}",
        f"/cluster/cluster/{cluster.id}",
        f"/cluster/location/{location.id}",
    ):
        with pytest.raises(APIError) as kept:
            admin.delete(path)
        assert kept.value.status_code == 409, path
    with pytest.raises(APIError) as kept:
        admin.cluster.update_location(location.id, CreateLocation(name="renamed"))
    assert kept.value.status_code == 409
    assert admin.cluster.list_hardware()[0].name == "node-a"


def test_registering_needs_an_admin_and_a_well_formed_body(api: str, admin: KamiwazaClient) -> None:
    minted = admin.post("/auth/pats", params={"name": "reader", "role": "user"})
    user = KamiwazaClient(base_url=api, api_key=minted["token"])
    with pytest.raises(APIError) as refused:
        user.cluster.create_location(CreateLocation(name="mine"))
    assert refused.value.status_code == 403
    for path, body in (
        ("/cluster/location", {"name": ""}),
        ("/cluster/location", {"name": "x", "shelf": 3}),
        ("/cluster/hardware", {"name": "a\nb"}),
        ("/cluster/cluster", {"name": "c"}),
    ):
        with pytest.raises(APIError) as bad:
            admin.post(path, json=body)
        assert bad.value.status_code == 422, (path, body)
    assert len(admin.cluster.list_locations()) == 1  # nothing stored


def test_there_are_no_federations(admin: KamiwazaClient) -> None:
    assert admin.get("/cluster/federations") == []


def test_the_capabilities_sum_up_the_fleet(admin: KamiwazaClient, fleet_file: Path) -> None:
    fleet_file.write_text(TWO_NODES)
    admin.post("/cluster/refresh_hardware")
    found = admin.get("/cluster/cluster_capabilities")
    assert (found["nodes"], found["schedulable_nodes"], found["gpus"]) == (2, 2, 2)
    assert (found["gpu_vendors"], found["hardware_classes"]) == (["nvidia"], ["software_shared"])
    assert found["topology"] == admin.get("/cluster/runtime_config")["topology"]
    assert "llamacpp" in found["engines"]

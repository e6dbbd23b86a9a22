"""The control plane end to end on the real cluster: the chart installed with its API, the
chart's API (`cohabit serve --backend kubernetes`) and operator run here as the chart runs
them, as its ServiceAccount, on PostgreSQL; the published kamiwaza-sdk as the user.

kwok plays the kubelets, so pods become Running and Ready but no engine runs: nothing here
can chat with a model, and nothing pretends to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kamiwaza_sdk import KamiwazaClient
from kamiwaza_sdk.exceptions import DeploymentFailedError
from kubernetes import client

from cohabit.kube import crd
from cohabit.kube.runtime import md_name
from cohabit.units import GIB
from tests.cluster.conftest import Releases
from tests.cluster.controlplane import (
    Chart,
    install_with_api,
    model_deployments,
    only_slot,
    pods_added_since,
    pods_version,
    running_pod,
    sdk,
    tenant_pod,
)
from tests.cluster.harness import (
    WAIT_S,
    Cluster,
    run_api,
    run_operator,
    wait_for,
)
from tests.cluster.test_install import phase
from tests.service.test_sdk import register

WAIT = {"poll_interval_seconds": 0.1, "timeout_seconds": int(WAIT_S)}


def test_the_seed_walkthrough_two_share_a_t4_the_third_fails_fast_then_fits(
    api: client.ApiClient,
    namespace: str,
    t4: str,
    chart: Chart,
    tmp_path: Path,
) -> None:
    """A and B (6 GiB each) reach DEPLOYED with their pods Running on gpu 0 of the T4; C
    fails fast with insufficient_capacity and no pod of it is ever created; once B is
    stopped C fits."""
    node = t4
    user = sdk(chart.api.url)
    a, b, c = (register(user, tmp_path, name) for name in ("model-a", "model-b", "model-c"))

    served = {}
    for model in (a, b):
        deployment_id = user.serving.deploy_model(model_id=model, vram_allocation=6 * GIB, **WAIT)
        assert user.serving.get_deployment(deployment_id).status == "DEPLOYED"
        raw = user.get(f"/serving/deployment/{deployment_id}")
        assert (raw["node_name"], raw["gpu_indices"], raw["allocated_capacity_gb"]) == (
            node,
            [0],
            6,
        )
        pod = running_pod(api, namespace, f"{md_name(str(deployment_id))}-engine")
        assert pod.spec.node_name == node
        requests = pod.spec.containers[0].resources.requests
        assert {k: v for k, v in requests.items() if k.startswith("cohabit.dev/")} == {
            "cohabit.dev/vram-gb-gpu-0": "6"
        }
        served[model] = deployment_id

    before_c = pods_version(api, namespace)
    with pytest.raises(DeploymentFailedError) as failed:
        user.serving.deploy_model(model_id=c, vram_allocation=6 * GIB, **WAIT)
    assert failed.value.last_error_code == "NoFitError"
    assert failed.value.last_error_message.startswith("insufficient_capacity: 0/1 nodes fit")
    refused = str(failed.value.deployment_id)
    assert md_name(refused) not in model_deployments(api, namespace)
    added = pods_added_since(api, namespace, before_c)
    assert not [p for p in added if p.startswith(md_name(refused))], added

    assert user.serving.stop_deployment(served[b]) is True
    fits = user.serving.deploy_model(model_id=c, vram_allocation=6 * GIB, **WAIT)
    assert user.serving.get_deployment(fits).status == "DEPLOYED"
    pod = running_pod(api, namespace, f"{md_name(str(fits))}-engine")
    assert pod.spec.node_name == node


def timeline(user: KamiwazaClient, deployment_id: object) -> list[str]:
    """The kinds of the deployment's events, oldest first (GET …/events)."""
    found = user.get(f"/serving/deployment/{deployment_id}/events")
    return [event["kind"] for event in found["events"]]


HOLD = "cohabit-test/graceful-stop"  # a finalizer: the pod stays Terminating while it is there


@pytest.fixture
def held(api: client.ApiClient, namespace: str) -> Iterator[list[str]]:
    """Pods the test holds Terminating (names appended); let go afterwards, or the
    namespace could not be deleted."""
    names: list[str] = []
    yield names
    core = client.CoreV1Api(api)
    for name in names:
        try:
            core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise


def test_c_fits_while_the_stopped_b_pod_is_still_terminating(
    api: client.ApiClient,
    namespace: str,
    t4: str,
    chart: Chart,
    held: list[str],
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """A kubelet takes a while to stop an engine (up to the pod's grace period); kwok
    removes a pod at once, so a finalizer holds B's pod Terminating here. Right after B is
    stopped C must not be refused for the budget B's going pod still holds: the control
    plane places C (the pod is not counted as someone else's), the operator waits for the
    pod to go instead of refusing the pin, then C runs."""
    server = chart.api
    user = sdk(server.url)
    a, b, c = (register(user, tmp_path, name) for name in ("model-a", "model-b", "model-c"))
    _, placed = (
        user.serving.deploy_model(model_id=model, vram_allocation=6 * GIB, **WAIT)
        for model in (a, b)
    )
    b_pod = f"{md_name(str(placed))}-engine"
    core = client.CoreV1Api(api)
    core.patch_namespaced_pod(b_pod, namespace, {"metadata": {"finalizers": [HOLD]}})
    held.append(b_pod)

    assert user.serving.stop_deployment(placed) is True
    wait_for(
        lambda: core.read_namespaced_pod(b_pod, namespace).metadata.deletion_timestamp,
        what="B's pod to be Terminating",
    )
    # A fleet refresh after that, made visible: another tenant takes 1 GiB of the card.
    tenant_pod(api, tenant_namespace, "theirs", node=t4, gib=1)
    seen = wait_for(
        lambda: (slot := only_slot(user.get("/cluster/hardware")))["capacity_gb"] != 15 and slot,
        what="the control plane to see the other tenant's pod",
    )
    assert seen["capacity_gb"] == 14, seen  # not 8: B's pod is not someone else's

    deployed = user.serving.deploy_model(model_id=c, vram_allocation=6 * GIB, wait=False)
    c_md = md_name(str(deployed))
    waiting = wait_for(
        lambda: (
            (md := model_deployments(api, namespace).get(c_md))
            and md.get("status", {}).get("conditions")
            and md["status"]
        ),
        what="the operator to take up C",
    )
    assert waiting["phase"] == "DEPLOYING", waiting
    assert b_pod in waiting["conditions"][-1]["message"], waiting
    wait_for(
        lambda: user.serving.get_deployment(deployed).status == "INITIALIZING",
        what="C to be handed to the cluster (INITIALIZING, not refused)",
    )

    core.patch_namespaced_pod(b_pod, namespace, {"metadata": {"finalizers": None}})
    assert user.serving.wait_deployment_ready(deployed, **WAIT)
    assert running_pod(api, namespace, f"{c_md}-engine").spec.node_name == t4


EDITED = {"image": "registry.example/by-hand:1", "config": {"maxNumSeqs": 4}}


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(None, id="spec-unchanged"),
        pytest.param(EDITED, id="spec-edited-by-hand"),
    ],
)
def test_a_restart_relaunches_a_lost_pod_with_exactly_its_spec(
    api: client.ApiClient,
    namespace: str,
    cluster: Cluster,
    releases: Releases,
    postgres_url: str,
    log_dir: Path,
    t4: str,
    tmp_path: Path,
    edit: dict[str, object] | None,
) -> None:
    """While the control plane is down its deployment's pod is lost (and, in one case, a
    person edited its ModelDeployment's spec first): the next start relaunches it inside the
    budget it holds, with the spec exactly the control plane's (no key of the edit left),
    and the operator acts on it though the spec may be unchanged (no new generation)."""
    release = install_with_api(releases, cluster, postgres_url)
    operator = run_operator(release, log_dir)
    server = run_api(release, log_dir)
    try:
        user = sdk(server.url)
        model = register(user, tmp_path, "model-a")
        deployed = user.serving.deploy_model(model_id=model, vram_allocation=6 * GIB, **WAIT)
        name, pod = md_name(str(deployed)), f"{md_name(str(deployed))}-engine"
        ours = model_deployments(api, namespace)[name]["spec"]
        image = running_pod(api, namespace, pod).spec.containers[0].image
        server.process.stop()

        custom = client.CustomObjectsApi(api)
        if edit is not None:
            custom.patch_namespaced_custom_object(
                crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, {"spec": edit}
            )
            # Served again, as the operator records it for the new generation: only a pod
            # lost after serving makes the ERROR below (before, FAILED).
            wait_for(
                lambda: (
                    (md := model_deployments(api, namespace)[name])["status"].get(
                        "observedGeneration"
                    )
                    == md["metadata"]["generation"]
                    and md["status"]["phase"] == "DEPLOYED"
                ),
                what="the operator to serve the edited spec",
            )
            assert running_pod(api, namespace, pod).spec.containers[0].image == edit["image"]
        client.CoreV1Api(api).delete_namespaced_pod(pod, namespace)
        lost = phase(api, namespace, name, "ERROR")
        assert lost["lastErrorCode"] == "CONTAINER_EXITED", lost

        server = run_api(release, log_dir)
        user = sdk(server.url)

        # Until the new process takes the deployment up it still reads DEPLOYED, as stored:
        # its timeline says when its engine was started, and served, a second time.
        def relaunched() -> list[str] | None:
            kinds = timeline(user, deployed)
            return kinds if kinds.count("healthy") == 2 or "failed" in kinds else None

        kinds = wait_for(relaunched, what="the relaunched engine to serve, or it to fail")
        assert kinds.count("started") == 2 and "failed" not in kinds, kinds
        assert user.serving.get_deployment(deployed).status == "DEPLOYED"
        assert model_deployments(api, namespace)[name]["spec"] == ours
        assert running_pod(api, namespace, pod).spec.containers[0].image == image
    finally:
        server.process.stop()
        operator.stop()


# --- what a person does to a running deployment with kubectl -------------------------------


@pytest.mark.parametrize(
    ("action", "status", "code", "words"),
    [
        pytest.param("delete-pod", "ERROR", "CONTAINER_EXITED", "was deleted", id="pod-deleted"),
        pytest.param(
            "delete-md", "ERROR", "CONTAINER_EXITED", "was deleted outside cohabit",
            id="model-deployment-deleted",
        ),
        pytest.param(
            "pause", "ERROR", "CONTAINER_EXITED", "was paused outside cohabit", id="paused"
        ),
    ],
)  # fmt: skip
def test_a_deployed_model_changed_by_hand_is_no_longer_reported_serving(
    api: client.ApiClient,
    namespace: str,
    chart: Chart,
    tmp_path: Path,
    action: str,
    status: str,
    code: str,
    words: str,
) -> None:
    """Its pod deleted, its ModelDeployment deleted or paused: the control plane stops
    reporting it DEPLOYED, as for a local engine that exited after serving, stopped by
    whatever hand (ERROR, CONTAINER_EXITED, the message saying what happened), and its
    budget comes free."""
    server = chart.api
    user = sdk(server.url)
    model = register(user, tmp_path, "model-a")
    deployed = user.serving.deploy_model(model_id=model, vram_allocation=6 * GIB, **WAIT)
    name = md_name(str(deployed))
    running_pod(api, namespace, f"{name}-engine")
    custom = client.CustomObjectsApi(api)
    if action == "delete-pod":
        client.CoreV1Api(api).delete_namespaced_pod(f"{name}-engine", namespace)
    elif action == "delete-md":
        custom.delete_namespaced_custom_object(crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
    else:
        custom.patch_namespaced_custom_object(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, {"spec": {"state": "paused"}}
        )
    record = wait_for(
        lambda: (r := user.get(f"/serving/deployment/{deployed}"))["status"] != "DEPLOYED" and r,
        what="the control plane to see the change",
    )
    assert (record["status"], record["last_error_code"]) == (status, code), record
    assert words in (record["last_error_message"] or ""), record
    wait_for(
        lambda: only_slot(user.get("/cluster/hardware"))["reserved_bytes"] == 0,
        what="its budget to come free",
    )

"""A ModelDeployment's model files inside its engine pod (`spec.storage`): the volume, its
read-only mount in the engine container, the init container that fills a Hugging Face
download, and the model path the engine is given. Pure builders of wire JSON.

The download runs `hf download <repo> [<file>] [--revision R] --local-dir <dir>`, the
command huggingface_hub installs as `hf` (src/huggingface_hub/cli/download.py; the token
comes from `HF_TOKEN`, utils/_auth.py). `--local-dir` gives plain paths the engine can load
(`<mount>/<org>/<name>/<file>`), and skips files already there when the volume is a PVC.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from cohabit.kube.crd import ModelDeploymentSpec, ModelStorage

VOLUME = "models"
DOWNLOAD_CONTAINER = "download"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodStorage:
    """What the pod needs for its model: volumes, the engine's mounts, init containers,
    and the model path as the engine sees it."""

    model_path: str
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)


def pod_storage(spec: ModelDeploymentSpec, *, downloader_image: str) -> PodStorage:
    """The pod's side of `spec.storage`; without it the model is passed as written (a Hub
    repo id the engine fetches itself, or a path already in the image)."""
    storage = spec.storage
    if storage is None:
        return PodStorage(model_path=spec.model)
    mount = {"name": VOLUME, "mountPath": storage.mount_path, "readOnly": True}
    source = storage.hugging_face
    if source is None:
        return PodStorage(
            model_path=_inside(storage, spec.model),
            volumes=[_volume(storage)],
            mounts=[mount],
        )
    target = posixpath.join(storage.mount_path, source.repo)
    command = ["hf", "download", source.repo]
    if source.file:
        command.append(source.file)
    if source.revision:
        command += ["--revision", source.revision]
    command += ["--local-dir", target]
    download: dict[str, Any] = {
        "name": DOWNLOAD_CONTAINER,
        "image": downloader_image,
        "command": command,
        "volumeMounts": [{"name": VOLUME, "mountPath": storage.mount_path}],
    }
    if source.token_secret is not None:
        download["env"] = [
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": source.token_secret.name,
                        "key": source.token_secret.key,
                    }
                },
            }
        ]
    return PodStorage(
        model_path=posixpath.join(target, source.file) if source.file else target,
        volumes=[_volume(storage)],
        mounts=[mount],
        init_containers=[download],
    )


def _inside(storage: ModelStorage, model: str) -> str:
    """`spec.model` inside the mounted volume: a relative path is joined to the mount, an
    absolute one is kept (it must lie under the mount to be found)."""
    return model if model.startswith("/") else posixpath.join(storage.mount_path, model)


def _volume(storage: ModelStorage) -> dict[str, Any]:
    if storage.persistent_volume_claim is not None:
        claim = storage.persistent_volume_claim.claim_name
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    if storage.host_path is not None:
        return {"name": VOLUME, "hostPath": {"path": storage.host_path.path, "type": "Directory"}}
    source = storage.hugging_face
    if source is not None and source.claim_name:
        return {"name": VOLUME, "persistentVolumeClaim": {"claimName": source.claim_name}}
    return {"name": VOLUME, "emptyDir": {}}

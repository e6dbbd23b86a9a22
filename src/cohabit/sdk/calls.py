"""Every REST call the SDK makes, as a `Call` value: path, parameters, body and the schema its
answer is read into. The sync and async services run the same calls, so the wire format is
written once. Paths are relative to the API root (docs/api.md). A list route's call takes the
`Page` it asks for; sdk/paging.py walks every page.

A schema is named here and imported, with pydantic, when the first answer is read: making a
call costs nothing, so a reader that takes the answer as JSON (`http.unparsed`, the command
line's `ps`) never loads them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cohabit.sdk.http import Call
from cohabit.sdk.paging import Page

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from cohabit.sdk.schemas import (
        ApiToken,
        ContainerLogPatternResponse,
        ContainerLogResponse,
        CreatedToken,
        CreateModel,
        CreateModelConfig,
        CreateModelDeployment,
        Deployment,
        DeploymentEvents,
        DownloadStarted,
        DownloadStatus,
        HardwareNode,
        Model,
        ModelConfig,
        ModelFile,
        ModelInstance,
        UserInfo,
        VariantList,
        VramEstimate,
    )

Id = UUID | str


def _one(schema: str) -> Callable[[Any], Any]:
    """Reads an answer into the model `schema` of sdk/schemas.py."""
    return lambda data: _adapter(schema, many=False).validate_python(data)


def _many(schema: str) -> Callable[[Any], Any]:
    """Reads an answer into a list of the model `schema` of sdk/schemas.py."""
    return lambda data: _adapter(schema, many=True).validate_python(data)


@cache
def _adapter(schema: str, *, many: bool) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    from cohabit.sdk import schemas

    model = getattr(schemas, schema)
    return TypeAdapter(list[model] if many else model)  # type: ignore[valid-type]


def _status(data: Any) -> str:
    """The server answers a bare string (`"DEPLOYED"`); older ones an object with `status`."""
    if isinstance(data, dict):
        return str(data["status"])
    return str(data)


def _deployment_id(data: Any) -> UUID:
    return UUID(str(data))


def _raw(data: Any) -> Any:
    return data


# serving


def deploy(request: CreateModelDeployment) -> Call[UUID]:
    return Call(
        method="POST", path="/serving/deploy_model", json=request.body(), parse=_deployment_id
    )


def estimate(request: CreateModelDeployment) -> Call[VramEstimate]:
    return Call(
        method="POST",
        path="/serving/estimate_model_vram",
        json=request.body(),
        parse=_one("VramEstimate"),
    )


def deployments(model_id: Id | None, page: Page) -> Call[list[Deployment]]:
    params = page.params() | ({} if model_id is None else {"model_id": str(model_id)})
    return Call(method="GET", path="/serving/deployments", params=params, parse=_many("Deployment"))


def deployment(deployment_id: Id, *, timeout_s: float | None = None) -> Call[Deployment]:
    return Call(
        method="GET",
        path=f"/serving/deployment/{deployment_id}",
        parse=_one("Deployment"),
        timeout_s=timeout_s,
    )


def deployment_status(deployment_id: Id) -> Call[str]:
    return Call(method="GET", path=f"/serving/deployment/{deployment_id}/status", parse=_status)


def deployment_logs(deployment_id: Id, *, copy: int = 0) -> Call[ContainerLogResponse]:
    """`copy`: which copy's engine (0: the deployment's own; sent only when another)."""
    return Call(
        method="GET",
        path=f"/serving/deployment/{deployment_id}/logs",
        params={"copy": str(copy)} if copy else None,
        parse=_one("ContainerLogResponse"),
    )


def deployment_log_patterns(deployment_id: Id) -> Call[ContainerLogPatternResponse]:
    return Call(
        method="GET",
        path=f"/serving/deployment/{deployment_id}/logs/patterns",
        parse=_one("ContainerLogPatternResponse"),
    )


def deployment_events(
    deployment_id: Id, *, after: int = 0, limit: int | None = None
) -> Call[DeploymentEvents]:
    params = {"after": str(after)} | ({} if limit is None else {"limit": str(limit)})
    return Call(
        method="GET",
        path=f"/serving/deployment/{deployment_id}/events",
        params=params,
        parse=_one("DeploymentEvents"),
    )


def stop(deployment_id: Id, *, force: bool = False) -> Call[bool]:
    return Call(
        method="DELETE",
        path=f"/serving/deployment/{deployment_id}",
        params={"force": str(force).lower()},
        parse=bool,
    )


def model_instances(deployment_id: Id | None = None) -> Call[list[ModelInstance]]:
    params = None if deployment_id is None else {"deployment_id": str(deployment_id)}
    return Call(
        method="GET", path="/serving/model_instances", params=params, parse=_many("ModelInstance")
    )


def health() -> Call[list[dict[str, str]]]:
    return Call(method="GET", path="/serving/health", parse=_raw)


def serving_status() -> Call[dict[str, str]]:
    return Call(method="GET", path="/serving/status", parse=_raw)


# models and configs


def models(page: Page) -> Call[list[Model]]:
    return Call(method="GET", path="/models/", params=page.params(), parse=_many("Model"))


def model(model_id: Id) -> Call[Model]:
    return Call(method="GET", path=f"/models/{model_id}", parse=_one("Model"))


def create_model(request: CreateModel) -> Call[Model]:
    body = request.model_dump(mode="json", exclude_none=True)
    return Call(method="POST", path="/models/", json=body, parse=_one("Model"))


def model_configs(model_id: Id, page: Page) -> Call[list[ModelConfig]]:
    return Call(
        method="GET",
        path="/model_configs/",
        params={"model_id": str(model_id)} | page.params(),
        parse=_many("ModelConfig"),
    )


def model_config(config_id: Id) -> Call[ModelConfig]:
    return Call(method="GET", path=f"/model_configs/{config_id}", parse=_one("ModelConfig"))


def create_model_config(request: CreateModelConfig) -> Call[ModelConfig]:
    body = request.model_dump(mode="json", exclude_none=True)
    return Call(method="POST", path="/model_configs/", json=body, parse=_one("ModelConfig"))


def update_model_config(config_id: Id, request: CreateModelConfig) -> Call[ModelConfig]:
    body = request.model_dump(mode="json", exclude_none=True)
    return Call(
        method="PUT", path=f"/model_configs/{config_id}", json=body, parse=_one("ModelConfig")
    )


def delete_model_config(config_id: Id) -> Call[ModelConfig]:
    return Call(method="DELETE", path=f"/model_configs/{config_id}", parse=_one("ModelConfig"))


def delete_model(model_id: Id, *, delete_files: bool = False) -> Call[dict[str, Any]]:
    params = {"delete_files": str(delete_files).lower()}
    return Call(method="DELETE", path=f"/models/{model_id}", params=params, parse=_raw)


def memory_usage(model_id: Id) -> Call[int]:
    return Call(method="GET", path=f"/models/{model_id}/memory_usage", parse=int)


def model_files() -> Call[list[ModelFile]]:
    return Call(method="GET", path="/model_files/", parse=_many("ModelFile"))


# cluster


def cluster_hardware() -> Call[list[HardwareNode]]:
    return Call(method="GET", path="/cluster/hardware", parse=_many("HardwareNode"))


# identity and tokens


def ping() -> Call[dict[str, str]]:
    return Call(method="GET", path="/ping", parse=_raw)


def whoami() -> Call[UserInfo]:
    return Call(method="GET", path="/auth/users/me", parse=_one("UserInfo"))


def create_token(name: str, *, role: str, ttl_s: int | None = None) -> Call[CreatedToken]:
    params: dict[str, Any] = {"name": name, "role": role}
    if ttl_s is not None:
        params["ttl_seconds"] = ttl_s
    return Call(method="POST", path="/auth/pats", params=params, parse=_one("CreatedToken"))


def _pats(data: Any) -> list[ApiToken]:
    parsed: list[ApiToken] = _many("ApiToken")(data["pats"])
    return parsed


def tokens() -> Call[list[ApiToken]]:
    return Call(method="GET", path="/auth/pats", parse=_pats)


def revoke_token(ref: str) -> Call[str]:
    return Call(method="DELETE", path=f"/auth/pats/{ref}", parse=lambda data: str(data["jti"]))


# models from the Hub


def variants(repo_id: str, revision: str | None = None) -> Call[VariantList]:
    params = {"repo_id": repo_id} | ({"revision": revision} if revision else {})
    return Call(
        method="GET",
        path="/models/variants/",
        params=params,
        parse=_one("VariantList"),
        timeout_s=120,
    )


def download(
    repo_id: str,
    *,
    variant: str | None = None,
    files: list[str] | None = None,
    revision: str | None = None,
    hf_cache: bool = False,
) -> Call[DownloadStarted]:
    body = {
        "model": repo_id,
        "hub": "HubsHf",
        "version": revision,
        "variant": variant,
        "files_to_download": files,
        "hf_cache": hf_cache,
    }
    return Call(
        method="POST",
        path="/models/download/",
        json=body,
        parse=_one("DownloadStarted"),
        timeout_s=120,
    )


def download_status(model_id: Id) -> Call[list[DownloadStatus]]:
    return Call(
        method="GET",
        path="/model_files/download_status/",
        params={"model_ids": [str(model_id)]},
        parse=_many("DownloadStatus"),
    )

"""The node agent (a DaemonSet on standalone clusters): discovers this node's GPUs, labels the
node (`cohabit.dev/gpu-vendor`, `gpu-memory-class`, `gpu-memory-mib`, …) and keeps one integer
budget per GPU advertised, `cohabit.dev/vram-gb-gpu-<i>` in GiB (a unified-memory node: one,
gpu-0, the pool minus the OS reserve). With fractional placement off (`--whole-gpus`) it
advertises `cohabit.dev/gpu-<i>: 1` per device instead, so a pod still names its card.

Three backends behind `BudgetAdvertiser`: a kubelet device plugin per GPU (production; the
kubelet owns the resource and `Allocate` pins the GPU), a node-status PATCH reconciler
(unprivileged; re-publishes whenever the kubelet zeroes the resource, which it does after some
restarts — kubernetes PR #64784), and Dynamic Resource Allocation: the node's devices as
ResourceSlices whose memory several claims consume (`dra.py`), with the driver's kubelet
plugin (`draplugin/`). Label and budget values come from `hardware.labels`.

What it publishes comes from this machine's hardware (`hardware.discover`: NVML, amdsmi, the
host's memory). `--fleet FILE` gives it a simulated or recorded inventory instead: the node
named $NODE_NAME in a fleet file, the format `cohabit serve --fleet` reads (docs/fleet-file.md;
`cohabit gpus --export` records one from a real machine), for nodes whose hardware is not the
agent's to see, such as kwok's simulated nodes. There is nothing to measure then, so the
memory report must be off with it.

Beside the budgets, the agent's meter (`nodemeter.py`, on its own thread) reports what each
device really has in use and how much of it processes outside cohabit hold, as the node's
`cohabit.dev/memory` annotation; the control plane plans with it as the local server does
with its own meter. `--meter-interval 0` turns it off (and the agent then removes a report left
from before, as it removes its other stale labels and annotations).

Every `--interval-s` the agent reads its Node again and puts back what was lost: budgets the
kubelet zeroed or dropped, labels and annotations of ours that were removed (a Node deleted
and registered again has none). A call the API server refuses there is logged and tried
again at the next pass; one refused at the start ends the agent with the server's words,
since the chart's role or the node is wrong and a restart will not mend it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cohabit.hardware.errors import HardwareError
from cohabit.hardware.fleetfile import load_fleet
from cohabit.hardware.labels import (
    OUR_GPU_OFFERED_BY,
    allocatable_for_node,
    annotations_for_node,
    labels_for_node,
)
from cohabit.hardware.model import Node
from cohabit.kube import dra
from cohabit.kube.deviceplugin.plugin import (
    DEVICE_PLUGIN_DIR,
    Allocation,
    DevicePluginServer,
    GpuBudget,
)
from cohabit.kube.draplugin.plugin import DraPluginServer
from cohabit.kube.errors import AgentError, KubeError
from cohabit.kube.nodememory import ANNOTATION_MEMORY
from cohabit.kube.nodemeter import (
    DEFAULT_CHANGE_BYTES,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_INTERVAL_S,
    LabelsApi,
    NodeMeter,
)
from cohabit.units import SizeError, parse_size
from cohabit.yamlfile import FileProblem

log = logging.getLogger(__name__)

OUR_LABEL_PREFIX = "cohabit.dev/"
ANNOTATION_SLICES = "cohabit.dev/published"  # on our ResourceSlices: `_digest` of them
BUDGET_PREFIX = "cohabit.dev/vram-gb-gpu-"
WHOLE_PREFIX = "cohabit.dev/gpu-"


class NodeApi(LabelsApi, Protocol):
    """The calls the agent makes on its own Node (`cluster.NodePort`)."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_capacity(self, name: str, operations: list[dict[str, Any]]) -> None: ...


class BudgetAdvertiser(Protocol):
    """Keeps per-GPU budgets visible to the scheduler."""

    def publish(self, budgets: Sequence[GpuBudget]) -> None:
        """Advertise these budgets (the first time, or after the hardware changed)."""
        ...

    def reconcile(self, node: Mapping[str, Any]) -> bool:
        """One check against `node` (the Node as just read); re-advertise what was lost. True
        when something had to be redone."""
        ...

    def node_annotations(self) -> dict[str, str]:
        """Annotations this backend wants on the Node beside the devices' identities, as
        of its last `publish` or `reconcile`."""
        ...

    def close(self) -> None: ...


def budgets_for_node(node: Node, *, whole_gpus: bool = False) -> list[GpuBudget]:
    """The resources to advertise, one per GPU (or one for a unified pool): GiB budgets, or
    with `whole_gpus` one unit per device."""
    by_index = {gpu.index: gpu for gpu in node.gpus}
    prefix = WHOLE_PREFIX if whole_gpus else BUDGET_PREFIX
    budgets = []
    for resource, value in allocatable_for_node(node, whole_gpus=whole_gpus).items():
        index = int(resource.removeprefix(prefix))
        gpu = by_index.get(index) or (node.gpus[0] if node.gpus else None)
        if gpu is None:
            continue
        budgets.append(
            GpuBudget(
                index=index,
                resource=resource,
                units=int(value),
                vendor=gpu.vendor,
                device=gpu.uuid or str(gpu.index),
                whole=whole_gpus,
            )
        )
    return budgets


class StatusPatchAdvertiser:
    """Writes `status.capacity` with JSON patches (the documented way to advertise an
    extended resource) and writes it again whenever the kubelet has zeroed or dropped it."""

    def __init__(self, api: NodeApi, node_name: str) -> None:
        self.api = api
        self.node_name = node_name
        self._wanted: dict[str, str] = {}

    def publish(self, budgets: Sequence[GpuBudget]) -> None:
        self._wanted = {budget.resource: str(budget.units) for budget in budgets}
        self.reconcile(self.api.get_node(self.node_name))

    def reconcile(self, node: Mapping[str, Any]) -> bool:
        status = node.get("status") or {}
        capacity: Mapping[str, str] = status.get("capacity") or {}
        operations = capacity_patch(capacity, self._wanted, has_capacity="capacity" in status)
        if operations:
            log.info("re-publishing %d budget(s) on %s", len(operations), self.node_name)
            self.api.patch_capacity(self.node_name, operations)
        return bool(operations)

    def node_annotations(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        """Budgets stay published: a restarting agent must not drop them from under pods."""


def capacity_patch(
    capacity: Mapping[str, str], wanted: Mapping[str, str], *, has_capacity: bool = True
) -> list[dict[str, Any]]:
    """JSON-patch operations that make our budgets in `capacity` equal `wanted` (and remove
    ours that no longer exist). `~1` escapes the `/` in resource names (RFC 6901)."""
    if not has_capacity and wanted:
        return [{"op": "add", "path": "/status/capacity", "value": dict(wanted)}]
    operations: list[dict[str, Any]] = []
    for resource, value in wanted.items():
        if str(capacity.get(resource)) != value:
            path = "/status/capacity/" + resource.replace("~", "~0").replace("/", "~1")
            operations.append({"op": "add", "path": path, "value": value})
    for resource in capacity:
        if _ours(resource) and resource not in wanted:
            path = "/status/capacity/" + resource.replace("~", "~0").replace("/", "~1")
            operations.append({"op": "remove", "path": path})
    return operations


def _ours(resource: str) -> bool:
    """A resource this agent publishes (either mode), so a switch of mode drops the old."""
    tail = resource.removeprefix(WHOLE_PREFIX)
    return resource.startswith(BUDGET_PREFIX) or (tail != resource and tail.isdigit())


class DevicePluginAdvertiser:
    """One device plugin server per budget in the kubelet's device-plugins directory."""

    def __init__(
        self, directory: Path | None = None, *, allocation: Allocation = Allocation.CDI
    ) -> None:
        self.directory = directory or DEVICE_PLUGIN_DIR
        self.allocation = allocation
        self._servers: list[DevicePluginServer] = []

    def publish(self, budgets: Sequence[GpuBudget]) -> None:
        self.close()
        self._servers = [
            DevicePluginServer(budget, self.directory, self.allocation) for budget in budgets
        ]
        for server in self._servers:
            server.start()

    def reconcile(self, node: Mapping[str, Any]) -> bool:
        """Restart and re-register every plugin whose socket the kubelet removed (the Node
        itself says nothing about them: the kubelet owns these resources)."""
        redone = False
        for server in self._servers:
            if server.lost():
                log.info("kubelet socket gone; re-registering %s", server.budget.resource)
                server.start()
                redone = True
        return redone

    def node_annotations(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        for server in self._servers:
            server.stop()


class SliceApi(Protocol):
    """The calls the DRA backend makes (`cluster.NodePort`)."""

    def get_node(self, name: str) -> dict[str, Any]: ...

    def node_slices(self, node: str, *, driver: str | None = ...) -> list[dict[str, Any]]: ...

    def put_slice(self, body: Mapping[str, Any], *, version: str | None) -> None: ...

    def delete_slice(self, name: str) -> None: ...

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class ResourceSliceAdvertiser:
    """The DRA backend: the node's devices as ResourceSlices of driver `gpu.cohabit.dev`
    (`dra.node_slices`, from the node's hardware rather than the budgets: capacity in bytes,
    partitions beside their card), and the driver's kubelet plugin, which prepares the
    claims the kube-scheduler allocates on them (`plugin` None: not served, for an agent
    whose kubelet is not its to reach, such as kwok's nodes).

    Each slice carries a digest of what was published (`ANNOTATION_SLICES`): a pass finds
    the slices unchanged by comparing it, since the API server rewrites quantities in its own
    form. Any difference (a slice deleted or edited, the Node registered again, the hardware
    changed) publishes them all again under the next pool generation, and deletes slices of
    ours for this node that are no longer wanted.

    A GPU that something else offers too (another DRA driver's slice on this node names it,
    or the vendor's device plugin hands out that vendor's cards here:
    `dra.offered_elsewhere`) is left out of the slices, so no claim of ours is allocated on
    a card the other could give away, and the Node says who offers it
    (`cohabit.dev/gpu-<i>-offered-by`), which placement reads. Claims already allocated on
    it stand; the card is published again once the other gives it up."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        hardware: Node,
        *,
        whole_gpus: bool = False,
        plugin: DraPluginServer | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.hardware = hardware
        self.whole_gpus = whole_gpus
        self.plugin = plugin
        self.offered_elsewhere: dict[int, str] = {}

    def publish(self, budgets: Sequence[GpuBudget]) -> None:
        """Serve the kubelet plugin and publish the slices (`budgets` are not used: the
        slices say more than they do)."""
        del budgets
        if self.plugin is not None:
            self.plugin.start()
        self.reconcile(self.api.get_node(self.node_name))

    def reconcile(self, node: Mapping[str, Any]) -> bool:
        on_node = self.api.node_slices(self.node_name, driver=None)
        current = {
            str(found["metadata"]["name"]): found
            for found in on_node
            if (found.get("spec") or {}).get("driver") == dra.DRIVER
        }
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        elsewhere = dra.offered_elsewhere(self.hardware, on_node, allocatable)
        if elsewhere != self.offered_elsewhere:
            log.info("GPUs of %s offered by others, not published: %s", self.node_name, elsewhere)
            self.offered_elsewhere = elsewhere
        wanted = dra.node_slices(
            self.hardware, whole_gpus=self.whole_gpus, owner=node, withdrawn=elsewhere
        )
        digest = _digest(wanted)
        names = {str(body["metadata"]["name"]) for body in wanted}
        if set(current) == names and all(
            ((found["metadata"].get("annotations") or {}).get(ANNOTATION_SLICES) == digest)
            for found in current.values()
        ):
            return False
        generation = 1 + max(
            (int(found["spec"]["pool"].get("generation", 0)) for found in current.values()),
            default=0,
        )
        log.info(
            "publishing %d ResourceSlice(s) of %s, generation %d",
            len(names),
            self.node_name,
            generation,
        )
        for body in wanted:
            body["spec"]["pool"]["generation"] = generation
            body["metadata"]["annotations"] = {ANNOTATION_SLICES: digest}
            found = current.get(str(body["metadata"]["name"]))
            version = None if found is None else str(found["metadata"]["resourceVersion"])
            self.api.put_slice(body, version=version)
        for name in set(current) - names:
            self.api.delete_slice(name)
        return True

    def node_annotations(self) -> dict[str, str]:
        """Who else offers each GPU left out of the slices."""
        return {
            OUR_GPU_OFFERED_BY.format(index=index): who
            for index, who in self.offered_elsewhere.items()
        }

    def close(self) -> None:
        """Slices stay published (claims allocated on them stand); the plugin stops."""
        if self.plugin is not None:
            self.plugin.stop()


def _digest(slices: Sequence[Mapping[str, Any]]) -> str:
    """What was published, in short: the slices' specs but for the pool generation, and the
    Node they belong to."""
    content = []
    for body in slices:
        spec = {**body["spec"], "pool": {**body["spec"]["pool"], "generation": 0}}
        content.append([body["metadata"].get("ownerReferences"), spec])
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class NodeAgent:
    """Labels one node and keeps its labels, annotations and budgets advertised."""

    def __init__(
        self,
        *,
        node_name: str,
        api: NodeApi,
        node: Node,
        advertiser: BudgetAdvertiser,
        whole_gpus: bool = False,
        memory_report: bool = False,
    ) -> None:
        self.node_name = node_name
        self.api = api
        self.node = node
        self.advertiser = advertiser
        self.whole_gpus = whole_gpus
        self.memory_report = memory_report

    def start(self) -> None:
        """Label the node, annotate its devices' identities (UUIDs and PCI addresses, which
        label values cannot hold), and advertise its budgets."""
        self._relabel(self.api.get_node(self.node_name))
        self.advertiser.publish(budgets_for_node(self.node, whole_gpus=self.whole_gpus))
        if self.advertiser.node_annotations():
            self._relabel(self.api.get_node(self.node_name))

    def tick(self) -> bool:
        """One pass: read the Node once, put back labels, annotations and budgets that were
        lost. True when something had to be redone."""
        current = self.api.get_node(self.node_name)
        advertised = self.advertiser.reconcile(current)
        return self._relabel(current) or advertised

    def _relabel(self, current: Mapping[str, Any]) -> bool:
        """Patch our labels and annotations where `current` differs from them; True when a
        patch was sent."""
        meta = current.get("metadata") or {}
        labels = changes(meta.get("labels") or {}, labels_for_node(self.node))
        wanted = {**annotations_for_node(self.node), **self.advertiser.node_annotations()}
        annotations = changes(meta.get("annotations") or {}, wanted)
        if self.memory_report:  # the meter's own, written from its thread: not ours to drop
            annotations.pop(ANNOTATION_MEMORY, None)
        if not labels and not annotations:
            return False
        self.api.patch_labels(self.node_name, labels, annotations)
        return True

    def run(self, stop: threading.Event, *, interval_s: float) -> None:
        """Start, then pass every `interval_s` until `stop`. A pass the API server refuses
        (or cannot answer), or a kubelet that refuses a plugin, is logged and tried again at
        the next pass: what was published stays published meanwhile."""
        self.start()
        try:
            while not stop.wait(interval_s):
                try:
                    self.tick()
                except KubeError as error:
                    log.warning(
                        "node %s: %s; trying again in %g s", self.node_name, error, interval_s
                    )
        finally:
            self.advertiser.close()


def changes(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """The part of `label_patch` that `current` does not already say."""
    return {
        key: value
        for key, value in label_patch(current, wanted).items()
        if current.get(key) != value
    }


def label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch setting our labels (or annotations) and removing ours that no longer
    apply (null)."""
    patch: dict[str, str | None] = {
        key: None for key in current if key.startswith(OUR_LABEL_PREFIX) and key not in wanted
    }
    patch.update(wanted)
    return patch


def _size(text: str) -> int:
    try:
        return parse_size(text, field="--meter-change")
    except SizeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parser() -> argparse.ArgumentParser:
    """The agent's command line (the chart's DaemonSet passes it)."""
    command = argparse.ArgumentParser(prog="python -m cohabit.kube.agent", allow_abbrev=False)
    command.add_argument(
        "--backend",
        choices=["device-plugin", "status-patch", "dra"],
        required=True,
        help="how the budgets reach the kube-scheduler: per-GPU extended resources by a "
        "device plugin or a node status patch, or ResourceSlices of the DRA driver "
        "gpu.cohabit.dev with its kubelet plugin",
    )
    command.add_argument(
        "--whole-gpus",
        action="store_true",
        help="fractional placement off: one cohabit.dev/gpu-<i> per device, not GiB budgets",
    )
    command.add_argument("--allocate", choices=[a.value for a in Allocation], default="cdi")
    command.add_argument(
        "--interval-s",
        type=float,
        default=10.0,
        help="seconds between checks that the node's budgets and labels are still there",
    )
    command.add_argument(
        "--fleet",
        type=Path,
        metavar="FILE",
        help="take this node's hardware from a fleet file (the node named $NODE_NAME; the "
        "format of `cohabit serve --fleet`) instead of discovering it: a simulated or "
        "recorded inventory; needs --meter-interval 0, as nothing is measured then",
    )
    command.add_argument(
        "--meter-interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between samples of the devices' memory (0: no memory report)",
    )
    command.add_argument(
        "--meter-heartbeat",
        type=float,
        default=DEFAULT_HEARTBEAT_S,
        help="seconds after which an unchanged memory report is written again",
    )
    command.add_argument(
        "--meter-change",
        type=_size,
        default=DEFAULT_CHANGE_BYTES,
        help="how far a figure must move before the report is written early (e.g. 256MiB)",
    )
    return command


def node_from_fleet(path: Path, name: str) -> Node:
    """The node called `name` in the fleet file at `path`.

    Raises:
        FileProblem: the file cannot be read as a fleet file.
        AgentError: it has no node of that name.
    """
    fleet = load_fleet(path)
    for node in fleet.nodes:
        if node.name == name:
            return node
    names = ", ".join(node.name for node in fleet.nodes)
    raise AgentError(f"{path}: no node named {name!r} (it has {names})")


def main(argv: Sequence[str] | None = None) -> None:
    from cohabit.hardware.discover import discover_local_node
    from cohabit.kube.cluster import NodePort, api_client

    command = parser()
    args = command.parse_args(argv)
    if args.meter_interval < 0 or args.meter_heartbeat <= 0:
        command.error("--meter-interval must be 0 or more and --meter-heartbeat more than 0")
    if args.fleet is not None and args.meter_interval > 0:
        command.error(
            "--fleet describes hardware this machine need not have, so there is nothing to "
            "measure: give --meter-interval 0 with it"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    node_name = os.environ.get("NODE_NAME")
    if not node_name:
        raise SystemExit("error: NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
    api = NodePort(api_client())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if args.fleet is not None:
            node = node_from_fleet(args.fleet, node_name)
        else:
            node = discover_local_node(name=node_name)
        advertiser: BudgetAdvertiser
        if args.backend == "device-plugin":
            advertiser = DevicePluginAdvertiser(allocation=Allocation(args.allocate))
        elif args.backend == "dra":
            advertiser = ResourceSliceAdvertiser(
                api,
                node_name,
                node,
                whole_gpus=args.whole_gpus,
                plugin=DraPluginServer(node, api.read_claim),
            )
        else:
            advertiser = StatusPatchAdvertiser(api, node_name)
        if args.meter_interval > 0:
            meter = NodeMeter(
                node=node,
                api=api,
                interval_s=args.meter_interval,
                heartbeat_s=args.meter_heartbeat,
                change_bytes=args.meter_change,
            )
            threading.Thread(target=meter.run, args=(stop,), name="meter", daemon=True).start()
        NodeAgent(
            node_name=node_name,
            api=api,
            node=node,
            advertiser=advertiser,
            whole_gpus=args.whole_gpus,
            memory_report=args.meter_interval > 0,
        ).run(stop, interval_s=args.interval_s)
    except (KubeError, FileProblem) as error:  # a refusal at the start: the server's words
        raise SystemExit(f"error: {error}") from None
    except HardwareError as error:
        raise SystemExit(f"error: hardware discovery failed: {error}") from None


if __name__ == "__main__":
    main()

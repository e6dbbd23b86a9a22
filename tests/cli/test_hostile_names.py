"""Names are printed as they are, never read as rich markup or emoji codes: every command that
prints a model's, token's, node's or request's name, run against a real server (loopback,
with the in-process engine double) or on local files holding names like `[/]`, `[red]x` or
`:thumbs_up:`, exits 0 with each name printed literally (a markup error used to come as a
traceback after the server had done the work). Commands run in this process
(tests/cli/inprocess.py): a subprocess per row would spend most of the test importing."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from rich.console import Console
from rich.progress import Progress

from cohabit.cli import output
from cohabit.cli.deploy import StatusLine
from cohabit.cli.pull import progress_columns
from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.units import GIB
from tests.cli.inprocess import invoke
from tests.estimate.tinymodels import write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import deploy, serving, settings_for, wait_status

NAMES = ("[/]", "[/bold]", "[link=http://x]y[/link]", "[red]x", ":thumbs_up:")
NODE = "[/bold]box"  # the server's node
ADMIN = "hostile-admin-token"
EVERY = NAMES  # what a listing must show


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    api: str
    model_path: Path  # a tiny GGUF
    fleet: Path  # a fleet file, a node named after each name
    requests: Path  # a request file, a request named after each name
    estimated: Path  # a tiny GGUF whose file is named after a name
    deployments: dict[str, str]  # name → its model's deployment id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("hostile")
    gpu = {"index": 0, "vendor": "nvidia", "product": "T4", "memory": "16GiB"}
    fleet = tmp / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"nodes": [{"name": n, "gpus": [gpu]} for n in NAMES]}))
    requests = tmp / "requests.yaml"
    requests.write_text(yaml.safe_dump({"requests": [{"name": n, "vram": "1GiB"} for n in NAMES]}))
    estimated, model_path = tmp / "[red]x.gguf", tmp / "tiny.gguf"
    write_gguf_model(estimated)
    write_gguf_model(model_path)
    server_fleet = Fleet(
        nodes=(
            Node(
                name=NODE,
                gpus=(
                    Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB),
                ),
            ),
        )
    )
    settings = settings_for(tmp, f"sqlite:///{tmp / 'cohabit.db'}", token=ADMIN)
    with (
        serving(settings, ScriptedRuntime(), fleet=server_fleet) as api,
        httpx.Client(
            base_url=api, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"}
        ) as http,
    ):
        deployments = {}
        for name in NAMES:
            model = http.post("/models/", json={"name": name, "path": str(model_path)})
            assert model.status_code == 201, model.text
            deployed = deploy(http, model.json()["id"], vram_allocation=GIB // 4)
            assert deployed.status_code == 202, deployed.text
            deployments[name] = deployed.json()
            token = http.post("/auth/pats", params={"name": name, "role": "user"})
            assert token.status_code == 201, token.text
        for deployment_id in deployments.values():
            assert wait_status(http, deployment_id)["status"] == "DEPLOYED"
        yield World(
            api=api,
            model_path=model_path,
            fleet=fleet,
            requests=requests,
            estimated=estimated,
            deployments=deployments,
        )


@pytest.fixture(autouse=True)
def reach(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COHABIT_BASE_URL", world.api)
    monkeypatch.setenv("COHABIT_API_TOKEN", ADMIN)
    # Room for every cell whole: this test is about what is printed, not how it is cut.
    monkeypatch.setattr(output.console, "width", 300)
    monkeypatch.setattr(output.err_console, "width", 300)
    monkeypatch.setenv("COLUMNS", "300")  # `ps` prints its table without rich


def case(args: list[str], shows: tuple[str, ...], code: int = 0) -> object:
    """A row: the arguments ({placeholders} come from the world), the names its output must
    hold, its exit code."""
    return pytest.param(args, shows, code, id=" ".join(args))


CASES = [
    case(["models", "ls"], EVERY),
    case(["ps"], (*EVERY, NODE)),
    case(["ps", "--wide", "--verbose"], (*EVERY, NODE)),
    case(["tokens", "ls"], EVERY),
    case(["gpus", "--url", "{api}"], (NODE,)),
    case(["gpus", "--fleet", "{fleet}"], EVERY),
    case(["plan", "{fleet}", "{requests}"], EVERY),
    case(["estimate", "{estimated}", "--engine", "llamacpp"], ("[red]x",)),
    case(["events", "{deployment}"], ("[link=http://x]y[/link]",)),
    *(case(["deploy", name, "--vram", "256MiB"], (name, NODE)) for name in NAMES),
    *(case(["tokens", "create", f"{name} cli"], (f"{name} cli",)) for name in NAMES),
    *(
        case(["models", "add", "{model_path}", "--name", f"{name}+"], (f"{name}+",))
        for name in NAMES
    ),
    case(["stop", "[/]nothing"], ("no deployment or model '[/]nothing'",), 2),
    case(["logs", "[red]x"], ("no deployment '[red]x'",), 2),
]


@pytest.mark.parametrize(("args", "shows", "code"), CASES)
def test_names_print_as_they_are(
    world: World, args: list[str], shows: tuple[str, ...], code: int
) -> None:
    values = {
        "{api}": world.api,
        "{fleet}": str(world.fleet),
        "{requests}": str(world.requests),
        "{estimated}": str(world.estimated),
        "{model_path}": str(world.model_path),
        "{deployment}": world.deployments["[link=http://x]y[/link]"],
    }
    result = invoke(*[values.get(arg, arg) for arg in args])
    printed = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), printed
    assert result.exit_code == code, printed
    for name in shows:
        assert name in printed, (name, printed)


@pytest.mark.parametrize("name", NAMES)
def test_a_pulled_file_name_prints_as_it_is(name: str) -> None:
    """`cohabit models pull` shows each file's progress under the name the Hub gives it."""
    with Progress(*progress_columns(), console=Console(file=io.StringIO())) as progress:
        progress.add_task(f"{name}.gguf", total=10)
        (task,) = progress.tasks
        assert progress_columns()[0].render(task).plain == f"{name}.gguf"


@pytest.mark.parametrize("name", NAMES)
def test_the_live_status_line_names_the_model_as_it_is(name: str) -> None:
    """`cohabit deploy` on a terminal redraws a spinner line naming the model."""
    line = StatusLine(name, live=True)
    line.accepted("3f2c19ab-6e82-42d7-a3b8-003f680db8cf")
    drawn = Console(file=io.StringIO(), width=200)
    drawn.print(line)
    assert f"{name} 3f2c19ab  REQUESTED" in drawn.file.getvalue()  # type: ignore[attr-defined]

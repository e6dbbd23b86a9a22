"""The commands of `cohabit`, in the order `cohabit --help` lists them: each one's module,
imported only when that command runs or shows its help (cli/app.py), and its description —
its line in `cohabit --help` and the text atop `cohabit NAME --help`. This module imports
nothing of the project, so listing the commands costs nothing. And how a group lists its
commands: each with its whole description."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typer.core import TyperGroup


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    module: str  # its `register(app)` adds the command (or the group) to `app`
    help: str


# (name, description), in the order `cohabit --help` lists them; each command's module is
# cohabit.cli.NAME.
ROWS = (
    ("plan", "Show where each request would land on FLEET, or why it cannot fit. Deploys nothing."),
    ("estimate", "How many bytes one GPU needs to serve MODEL with an engine and settings."),
    ("gpus", "Show GPUs, partitions and memory pools, with their hardware and sharing classes."),
    ("serve", "Run the control plane: REST API under /api, deployments placed and started."),
    (
        "deploy",
        "Deploy a model and watch it until it serves (or say why it cannot); one started "
        "with no copy (--copies 0) is UNLOADED until its first request.",
    ),
    (
        "ps",
        "List deployments with their copies (serving/running), node, GPU, class, budget "
        '(and measured memory: "!" marks one over its budget), status and endpoint (with '
        "--wide; else \"/v1\": the server's /v1 serves it by its model's name).",
    ),
    (
        "logs",
        "Print a deployment's engine log (or a copy's); --follow keeps printing until it ends.",
    ),
    ("events", "Print a deployment's timeline: time (UTC), kind, message."),
    ("stop", "Stop a deployment, or all of a model's active deployments."),
    ("chat", "Send one chat message to a deployment and print the reply."),
    ("models", "The server's model catalog: add, list, pull from the Hub."),
    ("tokens", "Named API tokens of the server: create, list, revoke."),
)
# The commands whose module is not cohabit.cli.NAME: none today.
MODULES: dict[str, str] = {}

COMMANDS = {
    name: Command(module=MODULES.get(name, f"cohabit.cli.{name}"), help=help) for name, help in ROWS
}


def help_of(name: str) -> str:
    """The description of the command `name`, for its module to register it with."""
    return COMMANDS[name].help


class Group(TyperGroup):
    """A group whose help lists each command with its whole description, where click would
    cut it to the first sentence that fits one line."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, self.describe(ctx, name)) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def describe(self, ctx: Any, name: str) -> str:
        """The first paragraph of the command's help."""
        command = self.get_command(ctx, name)
        return (command.help or "").partition("\n\n")[0] if command else ""

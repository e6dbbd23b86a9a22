"""Entry point of the `cohabit` command: the root of the command line, whose commands come from
the registry (cli/commands.py), each module imported only when its command runs or shows its
help. So `cohabit --help` imports no command at all, and `cohabit ps` imports neither the
estimator (numpy, gguf), the planner, the server nor httpx and pydantic (docs/cli.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import typer
import typer.main

from cohabit import __version__
from cohabit.cli.commands import COMMANDS, Group

# Plain help text: typer's rich help imports markdown-it and most of rich (more than the
# whole start-up budget of a command) to put the same words in boxes.
MARKUP = None


def build_app() -> typer.Typer:
    _plain_values_without_pydantic()
    app = typer.Typer(
        name="cohabit",
        help="Place many LLMs on shared GPUs: estimate, plan, reserve, serve.",
        cls=LazyGroup,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=MARKUP,
    )

    @app.callback(invoke_without_command=True)
    def _root(
        version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    ) -> None:
        if version:
            typer.echo(__version__)
            raise typer.Exit(0)

    return app


def main() -> None:
    build_app()()


class LazyGroup(Group):
    """The root command: its commands listed from the registry, each one made from its module
    the first time it is looked up."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands()

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def describe(self, ctx: Any, name: str) -> str:
        """The registry's description, with no command's module imported."""
        return COMMANDS[name].help


class _Commands(MutableMapping[str, Any]):
    """The root's commands by name, in the registry's order; looking one up makes it."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            if name not in COMMANDS:
                raise KeyError(name)
            self._made[name] = _make(name)
        return self._made[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._made[name] = command

    def __delitem__(self, name: str) -> None:
        del self._made[name]

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._made

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._made]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*COMMANDS, *self._made]))


def _make(name: str) -> Any:
    """The click command (or group) of `name`, from its module's `register(app)`."""
    app = typer.Typer(add_completion=False, rich_markup_mode=MARKUP)
    importlib.import_module(COMMANDS[name].module).register(app)
    return typer.main.get_group(app).commands[name]


@cache
def _plain_values_without_pydantic() -> None:
    """typer reads each parameter's value through a pydantic TypeAdapter it builds on first
    use, the `--help` flag's included, so every command would import pydantic (0.1 s here:
    more than `cohabit ps` may take in all) to pass a string or a flag through unchanged, or to
    make a path or an enum member of what click has already checked. Strings, and flags not
    read from the environment, take typer's own pass-through instead (what it uses for types
    pydantic cannot build); paths and enums (`Path | None` too) are made by their own type
    (`Path(value)`, `Policy(value)`: click's Choice has already refused any other value).
    Numbers, lists and anything else keep typer's coercion. A typer without these internals
    is left as it is."""
    try:
        from typer import core
        from typer._click.exceptions import BadParameter
        from typer._coercion import PassThroughRuntimeParam, RuntimeParam
    except ImportError:
        return
    build = getattr(core, "build_runtime_param", None)
    if build is None:
        return

    @dataclass(frozen=True)
    class MadeByItsType(RuntimeParam):
        made: type

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, self.made):
                return value
            try:
                return self.made(value)
            except (TypeError, ValueError):
                if issubclass(self.made, Enum):
                    named = ", ".join(repr(member.value) for member in self.made)
                    raise BadParameter(f"{value!r} is not one of {named}.") from None
                raise BadParameter(f"{value!r} is not a valid {self.made.__name__}.") from None

    def plain_first(descriptor: Any) -> Any:
        info = descriptor.parameter_info
        annotation = descriptor.annotation
        converted = info.parser is not None or getattr(info, "click_type", None) is not None
        if converted or descriptor.file_annotation is not None:
            return build(descriptor)
        if annotation is str or (annotation is bool and info.envvar is None):
            return PassThroughRuntimeParam(parameter_info=info, annotation=annotation)
        made = _made_by_its_type(annotation)
        if made is not None:
            return MadeByItsType(parameter_info=info, annotation=annotation, made=made)
        return build(descriptor)

    core.build_runtime_param = plain_first  # type: ignore[attr-defined]


def _made_by_its_type(annotation: Any) -> type | None:
    """`Path` or the Enum of a `Path`, `Path | None`, `Policy` or `Policy | None` annotation."""
    members = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(members) == 1:
        annotation = members[0]
    if annotation is Path or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        return annotation
    return None

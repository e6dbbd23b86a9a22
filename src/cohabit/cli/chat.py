"""`cohabit chat ID "prompt"`: one test prompt to a deployment through the server's
OpenAI-compatible gateway (/runtime/models/{id}/v1), to see that it answers."""

from __future__ import annotations

from typing import Annotated

import typer

from cohabit.cli.commands import help_of
from cohabit.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAULT,
    EXIT_UNREACHABLE,
    console,
    fail,
    print_json,
)
from cohabit.cli.remote import (
    DEFAULT_URL,
    DeploymentArgument,
    JsonOption,
    UrlOption,
    connected,
    deployment_or_fail,
)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("chat", help=help_of("chat"))(chat)


def chat(
    deployment: DeploymentArgument,
    prompt: Annotated[str, typer.Argument(help="What to say.")],
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Reply length cap.")] = 64,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    try:
        import openai
    except ImportError:
        fail("cohabit chat needs the openai package: pip install openai", code=EXIT_FAULT)
    with connected(url) as client:
        found = deployment_or_fail(client, deployment)
        if found.status.upper() != "DEPLOYED":
            fail(f"deployment {found.id} is {found.status}, not DEPLOYED", code=EXIT_BAD_INPUT)
        gateway = client.openai(found.id, max_retries=0, timeout=120)
        try:
            reply = gateway.chat.completions.create(
                model=found.m_name or str(found.id),
                messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens,
            )
        except openai.APIConnectionError as err:
            fail(f"cannot reach the gateway at {gateway.base_url}: {err}", code=EXIT_UNREACHABLE)
        except openai.APIStatusError as err:
            fail(
                f"the gateway at {gateway.base_url} answered {err.status_code}: {err.message}",
                code=EXIT_FAULT,
            )
    if as_json:
        print_json(reply.model_dump(mode="json"))
        return
    console.print(reply.choices[0].message.content or "")

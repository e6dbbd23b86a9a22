"""Model names: the rule a name must meet (visible text, nothing stripped), as a table; and
through the real app on SQLite and PostgreSQL, a name that breaks it is a 422 naming the
character and its position, one another model has (once normalised) a 409 naming that
model's id, and neither stores anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cohabit.service.registry.catalog import name_problem
from tests.estimate.tinymodels import write_gguf_model
from tests.service.server import register_tiny_gguf, scripted_client


@pytest.mark.parametrize(
    "name",
    [
        "tiny",
        "Llama-3.1-8B-Instruct Q4_K_M",
        "meta-llama/Llama-3.1-8B",
        "\u30e2\u30c7\u30eb",  # モデル
        "\uff54\uff49\uff4e\uff59",  # full-width: visible, and one name with "tiny"
        "na\u00efve",
        "llama\u00a03",  # a no-break space inside
        "\u0645\u062f\u0644",  # Arabic letters: right-to-left by themselves, no control
        "x",
    ],
)
def test_visible_names_are_fit(name: str) -> None:
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "is empty"),
        (" tiny", "starts with the space U+0020 SPACE at position 0"),
        ("tiny ", "ends with the space U+0020 SPACE at position 4"),
        ("\u00a0tiny", "starts with the space U+00A0 NO-BREAK SPACE at position 0"),
        ("tiny\u3000", "ends with the space U+3000 IDEOGRAPHIC SPACE at position 4"),
        ("tiny\t", "has the control character U+0009 at position 4"),
        ("ti\nny", "has the control character U+000A at position 2"),
        ("tiny\x85", "has the control character U+0085 at position 4"),
        (
            "ti\u202eny",
            "has the bidirectional control U+202E RIGHT-TO-LEFT OVERRIDE at position 2",
        ),
        (
            "\u202atiny",
            "has the bidirectional control U+202A LEFT-TO-RIGHT EMBEDDING at position 0",
        ),
        ("tiny\u2066", "has the bidirectional control U+2066 LEFT-TO-RIGHT ISOLATE at position 4"),
        (
            "ti\u2069ny",
            "has the bidirectional control U+2069 POP DIRECTIONAL ISOLATE at position 2",
        ),
        ("tiny\u200f", "has the bidirectional control U+200F RIGHT-TO-LEFT MARK at position 4"),
        ("ti\u200bny", "has the zero-width character U+200B ZERO WIDTH SPACE at position 2"),
        ("t\u200ciny", "has the zero-width character U+200C ZERO WIDTH NON-JOINER at position 1"),
        ("ti\u200dny", "has the zero-width character U+200D ZERO WIDTH JOINER at position 2"),
        (
            "\ufefftiny",
            "has the zero-width character U+FEFF ZERO WIDTH NO-BREAK SPACE at position 0",
        ),
        ("ti\u00adny", "has the invisible formatting character U+00AD SOFT HYPHEN at position 2"),
        (
            "tiny\U000e0041",
            "has the invisible formatting character U+E0041 TAG LATIN CAPITAL LETTER A at "
            "position 4",
        ),
        ("ti\u2028ny", "has the line separator U+2028 LINE SEPARATOR at position 2"),
        ("tiny\ue000", "has the private-use character U+E000 at position 4"),
        ("tiny\u0378", "has the unassigned code point U+0378 at position 4"),
        ("ti\ud800ny", "has the lone surrogate U+D800 at position 2"),
        # The first problem from the start is the one named.
        (
            " ti\u202eny",
            "has the bidirectional control U+202E RIGHT-TO-LEFT OVERRIDE at position 3",
        ),
    ],
)
def test_names_that_are_not_visible_text_are_refused(name: str, problem: str) -> None:
    assert name_problem(name) == problem


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path_factory.mktemp("names"), module_database_url) as http:
        yield http


def _models(client: httpx.Client) -> list[str]:
    return [model["id"] for model in client.get("/models/").json()]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "llama\u202e",
            "the name has the bidirectional control U+202E RIGHT-TO-LEFT OVERRIDE at position 5",
        ),
        ("tiny ", "the name ends with the space U+0020 SPACE at position 4"),
        (
            "ti\u200bny",
            "the name has the zero-width character U+200B ZERO WIDTH SPACE at position 2",
        ),
    ],
)
def test_an_unfit_name_is_a_422_naming_the_character(
    client: httpx.Client, tmp_path: Path, name: str, message: str
) -> None:
    write_gguf_model(tmp_path / "m.gguf")
    before = _models(client)
    answer = client.post("/models/", json={"name": name, "path": str(tmp_path / "m.gguf")})
    assert answer.status_code == 422
    assert answer.json() == {
        "detail": [{"loc": ["body", "name"], "msg": message, "type": "invalid_input"}]
    }
    assert _models(client) == before


def test_a_name_taken_from_the_file_is_held_to_the_rule(
    client: httpx.Client, tmp_path: Path
) -> None:
    path = tmp_path / " lead.gguf"
    write_gguf_model(path)
    answer = client.post("/models/", json={"path": str(path)})
    assert answer.status_code == 422
    (problem,) = answer.json()["detail"]
    assert problem["loc"] == ["body", "path"]
    assert problem["msg"] == (
        f"the name taken from {str(path)!r} starts with the space U+0020 SPACE at position 0: "
        "give the model a name ('name')"
    )


@pytest.fixture(scope="module")
def holder(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The id of the model named `names-test`."""
    path = _gguf(tmp_path_factory.mktemp("holder"), "holder")
    answer = client.post("/models/", json={"name": "names-test", "path": path})
    assert answer.status_code == 201, answer.text
    model_id: str = answer.json()["id"]
    return model_id


@pytest.mark.parametrize(
    "same",
    ["Names-Test", "NAMES-TEST", "\uff4e\uff41\uff4d\uff45\uff53-test"],
    ids=["title-case", "upper-case", "full-width"],
)
def test_a_taken_name_is_a_409_naming_the_model_that_has_it(
    client: httpx.Client, holder: str, tmp_path: Path, same: str
) -> None:
    before = _models(client)
    answer = client.post("/models/", json={"name": same, "path": _gguf(tmp_path, "other")})
    assert answer.status_code == 409
    assert answer.json() == {
        "detail": f"model name {same!r} is taken by model {holder} as 'names-test'"
    }
    assert _models(client) == before


def test_the_same_file_twice_without_a_name_is_a_409(client: httpx.Client, tmp_path: Path) -> None:
    first = register_tiny_gguf(client, tmp_path, name="same-file")
    answer = client.post("/models/", json={"path": str(tmp_path / "same-file.gguf")})
    assert answer.status_code == 409
    assert first["id"] in answer.json()["detail"]


def _gguf(tmp_path: Path, stem: str) -> str:
    path = tmp_path / f"{stem}.gguf"
    write_gguf_model(path)
    return str(path)

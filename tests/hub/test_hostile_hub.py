"""Downloads from a hostile Hub: the stand-in (tests/hub/standin.py, real HTTP on loopback,
recorded answers of the real Hub API) answers listings, headers and bodies a compromised mirror
could send, and nothing outside the model store (or the asked repo's folder of the Hugging Face
cache) is created, changed or deleted, no link is followed, and each refusal names the field.
The Hub is the one boundary stood in for; the client, the disk and the HTTP are real."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cohabit.hub import client
from cohabit.hub.client import HubFile
from cohabit.hub.errors import BadRepoId, FileDamaged, HubError, Refused
from cohabit.hub.headers import HEADER_BYTES, variant_estimates
from cohabit.hub.variants import Variant
from cohabit.sdk import Client
from cohabit.units import MIB
from tests.hub.hostile import (
    ASKED,
    COMMIT,
    VICTIM,
    download,
    plant,
    snapshot,
    use_cache_of,
)
from tests.hub.repos import tiny_repo
from tests.hub.standin import HubFileSpec, HubRepoSpec, StandInHub
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for

GOOD = b"GGUF" + bytes(range(60))  # what a file holds, and its listing's true hash
WRONG_SHA256 = "0" * 64


def spec(body: bytes = GOOD, **hostile: Any) -> HubFileSpec:
    return HubFileSpec(head=body, size=len(body), **hostile)


def sized_like_victim() -> dict[str, Any]:
    """Listed with the size of the file it names outside, and a hash that file fails."""
    size = len(VICTIM)
    return {"size": size, "lfs": {"sha256": WRONG_SHA256, "size": size, "pointerSize": 135}}


def as_queued(name: str, file: HubFileSpec) -> HubFile:
    """The row an older server queued from such a listing, unchecked."""
    lfs = file.listed.get("lfs", {"sha256": file.sha256}) or {}
    return HubFile(
        name=name,
        size_bytes=file.listed.get("size", file.size),
        sha256=lfs.get("sha256"),
        blob_id=file.listed.get("blobId", file.blob_id),
    )


@dataclass(frozen=True)
class Case:
    files: Callable[[Path], dict[str, HubFileSpec]]
    refused: tuple[type[HubError], ...]  # each error the attempt meets, in order
    says: str  # what the first error's message holds
    queue: bool = False  # also fetch the files as rows queued unchecked
    to_cache: bool = False
    answered_id: str | None = None
    commit: str = COMMIT


CASES = {
    "an absolute name": Case(
        files=lambda box: {f"{box}/outside/new.gguf": spec()},
        refused=(Refused, Refused),
        says="siblings[0].rfilename: '/",
        queue=True,
    ),
    "a name that climbs out with '..'": Case(
        files=lambda box: {"../../../../outside/new.gguf": spec()},
        refused=(Refused, Refused),
        says="has a '..' segment",
        queue=True,
    ),
    "a climbing name with the size of a file there and a wrong hash": Case(
        files=lambda box: {"../../../../outside/victim.bin": spec(listed=sized_like_victim())},
        refused=(Refused, Refused),
        says="has a '..' segment",
        queue=True,
    ),
    "an absolute name with the size of a file there and a wrong hash": Case(
        files=lambda box: {f"{box}/outside/victim.bin": spec(listed=sized_like_victim())},
        refused=(Refused, Refused),
        says="is absolute",
        queue=True,
    ),
    "a link in the store to a file outside, its size, a wrong hash": Case(
        files=lambda box: {"victim.gguf": spec(listed=sized_like_victim())},
        refused=(Refused,),
        says="victim.gguf is a symbolic link; it is not followed",
    ),
    "a link in the store to a folder outside": Case(
        files=lambda box: {"linked/new.gguf": spec()},
        refused=(Refused,),
        says="linked is a symbolic link; it is not followed",
    ),
    # The part was `.partial/<name>.<etag>.part`: this one was the sibling tree's state.part.
    "an ETag that climbs out of the part folder": Case(
        files=lambda box: {"ok.gguf": spec(etag="x/../../../../../../outside/state")},
        refused=(),
        says="",
    ),
    # huggingface_hub's hf_hub_download names the cache's blob after the ETag.
    "an ETag that climbs out of the cache": Case(
        files=lambda box: {"ok.gguf": spec(etag="../../../../outside/cache-blob")},
        refused=(),
        says="",
        to_cache=True,
    ),
    "another repo id answered, naming a file outside with its size": Case(
        files=lambda box: {"victim.bin": spec(listed=sized_like_victim())},
        refused=(FileDamaged,),  # fetched into the asked repo's folder, where it is too long
        says="victim.bin: the Hub sent more than the 19 bytes",
        answered_id="../../outside",
    ),
    "a commit that climbs out of the cache's snapshots": Case(
        files=lambda box: {"ok.gguf": spec()},
        refused=(Refused,),
        says="sha: '../../../outside' is not a commit id",
        commit="../../../outside",
        to_cache=True,
    ),
    "a body longer than its listed 18 bytes (200 MiB)": Case(
        files=lambda box: {"big.gguf": HubFileSpec(head=GOOD[:18], size=18, body_size=200 * MIB)},
        refused=(FileDamaged,),
        says="big.gguf: the Hub sent more than the 18 bytes it lists",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_hostile_answer_touches_nothing_outside_and_is_named(
    hub: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    plant(tmp_path)
    use_cache_of(tmp_path, monkeypatch)
    files = case.files(tmp_path)
    hub.add(
        HubRepoSpec(repo_id=ASKED, files=files, commit=case.commit, answered_id=case.answered_id)
    )
    before = snapshot(tmp_path)

    queued = tuple(as_queued(n, f) for n, f in files.items()) if case.queue else ()
    attempt = download(tmp_path, queued, commit=case.commit, to_cache=case.to_cache)

    assert snapshot(tmp_path) == before
    assert [type(e) for e in attempt.errors] == list(case.refused), attempt.errors
    assert case.says in str(attempt.errors[0] if attempt.errors else "")
    if attempt.listed is not None:
        assert attempt.listed.repo_id == ASKED  # never the id the Hub answered
    assert attempt.peak_bytes <= max(f.size for f in files.values())
    assert not list((tmp_path / "data" / "models").rglob("*.part"))  # a failed part is gone
    if not case.refused:
        root = "hf/hub/models--evil-org--model-GGUF" if case.to_cache else "data/models"
        (got,) = list((tmp_path / root).rglob("ok.gguf"))
        assert got.read_bytes() == GOOD


def test_a_body_past_its_size_is_not_read_to_its_end(hub: StandInHub, tmp_path: Path) -> None:
    plant(tmp_path)
    hub.add(
        HubRepoSpec(
            repo_id=ASKED,
            files={"big.gguf": HubFileSpec(head=GOOD[:18], size=18, body_size=200 * MIB)},
            commit=COMMIT,
        )
    )
    attempt = download(tmp_path)
    assert [type(e) for e in attempt.errors] == [FileDamaged]
    # What the server got out before the client hung up: its socket buffers, not 200 MiB.
    assert _served(hub, "big.gguf") < 32 * MIB


def test_a_variant_header_from_a_mirror_that_ignores_range_is_read_no_further(
    hub: StandInHub,
) -> None:
    head = tiny_repo().files["tiny-llama-Q4_K_M.gguf"].head
    name = "ranged-Q4_K_M.gguf"
    hub.add(
        HubRepoSpec(
            repo_id="evil-org/ranged-GGUF",
            files={name: HubFileSpec(head=head, size=160 * MIB)},
            commit=COMMIT,
        )
    )
    hub.ignore_range = True
    listing = client.repo("evil-org/ranged-GGUF", server=True)
    variant = Variant(name="Q4_K_M", files=(name,), size_bytes=160 * MIB)
    files = {f.name: f for f in listing.files}
    variant_estimates(listing.repo_id, variant, files, revision=COMMIT, server=True)
    assert _served(hub, name) < HEADER_BYTES + 16 * MIB  # the 32 MiB asked for, not 160


@pytest.mark.parametrize("asked", ["../../outside", "/etc/passwd", "a/b/c", "org/.hidden", ""])
def test_a_repo_id_the_hub_cannot_have_is_refused_before_it_is_asked(
    hub: StandInHub, asked: str
) -> None:
    with pytest.raises(BadRepoId, match="is not a Hub repo id"):
        client.repo(asked, server=True)
    assert hub.seen == []


def _served(hub: StandInHub, name: str) -> int:
    """Body bytes the stand-in sent for `name`, once its GET has ended."""
    deadline = time.monotonic() + 60
    while not any(n == name for n, _ in hub.served):
        assert time.monotonic() < deadline, "the body never ended"
        time.sleep(0.05)
    return max(sent for n, sent in hub.served if n == name)


# --- the property: whatever the Hub answers, nothing outside is touched -----------------

# Half the answers are well formed and hostile only in what they point at or send: names
# meeting a link planted in the store, sizes and hashes of files outside, wrong hashes, long
# bodies, ETags, another repo id, no range support. The other half is malformed anywhere.
FAIR_NAMES = st.sampled_from(
    ["ok.gguf", "sub/ok.gguf", "victim.gguf", "linked/keep.gguf", "linked/new.gguf", "victim.bin"]
)
MALFORMED_NAMES = st.one_of(
    st.sampled_from(
        [
            "{box}/outside/victim.bin",
            "{box}/outside/new.gguf",
            "../../../../outside/victim.bin",
            "../../../../outside/new.gguf",
            "../../settings.txt",
            "..\\..\\outside\\x.gguf",
            "nul\x00.gguf",
            "a//b.gguf",
            "./a.gguf",
            "x/",
            "",
            "\ud800.gguf",
            "x" * 300,
        ]
    ),
    st.lists(
        st.sampled_from(["..", ".", "", "outside", "sub", "victim.bin", "x.gguf", "linked"]),
        min_size=1,
        max_size=7,
    ).map("/".join),
)
# "true": the served body's size or hash; "victim": the size of the file outside.
FAIR_SIZES = st.one_of(st.sampled_from(["true", "victim"]), st.integers(0, 80))
MALFORMED_SIZES = st.sampled_from([-1, 2**63, "18", None, 1.5, True])
FAIR_HASHES = st.sampled_from(["true", "true", "wrong", None])
MALFORMED_HASHES = st.sampled_from(["../../../outside/x", "ABC", 7])
ETAGS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "../../../../outside/cache-blob",
            "x/../../../../../../outside/state",
            "{box}/outside/etag",
            "..",
            "",
        ]
    ),
    st.text(alphabet="./ab", max_size=24),
)


@st.composite
def hostile_file(draw: st.DrawFn, *, fair: bool) -> tuple[str, HubFileSpec]:
    def pick(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
        return draw(good if fair else st.one_of(good, bad))

    body = draw(st.binary(max_size=48))
    served = draw(st.one_of(st.none(), st.integers(0, 3000)))
    file = HubFileSpec(head=body, size=len(body), body_size=served, etag=draw(ETAGS))
    size = pick(FAIR_SIZES, MALFORMED_SIZES)
    listed_size = {"victim": len(VICTIM), "true": len(body)}.get(str(size), size)
    sha = pick(FAIR_HASHES, MALFORMED_HASHES)
    blob = pick(FAIR_HASHES, MALFORMED_HASHES)
    listed: dict[str, Any] = {"size": listed_size}
    listed["blobId"] = {"true": file.blob_id, "wrong": "0" * 40}.get(str(blob), blob)
    listed["lfs"] = None
    if sha is not None:
        digest = {"true": file.sha256, "wrong": WRONG_SHA256}.get(str(sha), sha)
        listed["lfs"] = {"sha256": digest, "size": listed_size, "pointerSize": 135}
    return pick(FAIR_NAMES, MALFORMED_NAMES), replace(file, listed=listed)


@st.composite
def hostile_answer(draw: st.DrawFn) -> dict[str, Any]:
    fair = draw(st.booleans())
    commits = [COMMIT] if fair else [COMMIT, "../../../outside", "main", ""]
    return {
        "files": draw(st.lists(hostile_file(fair=fair), min_size=1, max_size=2)),
        "answered_id": draw(
            st.sampled_from(
                [None, "../../outside", "{box}/outside", "evil-org/../../../outside", "other/repo"]
            )
        ),
        "commit": draw(st.sampled_from(commits)),
        "ignore_range": draw(st.booleans()),
        "to_cache": draw(st.booleans()),
        "queue": draw(st.booleans()),
    }


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answer=hostile_answer())
def test_no_answer_of_the_hub_touches_anything_outside_the_store(
    hub: StandInHub, tmp_path: Path, answer: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder, pytest.MonkeyPatch.context() as mp:
        box = Path(folder)
        plant(box)
        use_cache_of(box, mp)
        files = {name.replace("{box}", str(box)): f for name, f in answer["files"]}
        answered = answer["answered_id"]
        hub.repos = {}
        hub.add(
            HubRepoSpec(
                repo_id=ASKED,
                files=files,
                commit=answer["commit"],
                answered_id=answered.replace("{box}", str(box)) if answered else None,
            )
        )
        hub.ignore_range = answer["ignore_range"]
        before = snapshot(box)

        queued = tuple(as_queued(n, f) for n, f in files.items()) if answer["queue"] else ()
        attempt = download(box, queued, commit=answer["commit"], to_cache=answer["to_cache"])

        event("listing " + ("taken" if attempt.listed else "refused"))
        event("errors: " + ", ".join(sorted({type(e).__name__ for e in attempt.errors})))
        assert snapshot(box) == before
        if attempt.listed is not None:
            assert attempt.listed.repo_id == ASKED
        sizes = [f.listed["size"] for f in files.values() if type(f.listed["size"]) is int]
        assert attempt.peak_bytes <= max([0, *sizes])
        # Each is a refusal or a damaged file naming what it refused, never "could not be
        # reached" for an answer that came (an OSError or a parse fault wrapped).
        assert all(isinstance(e, Refused | FileDamaged) for e in attempt.errors), attempt.errors


def test_a_damaged_copy_in_the_store_stays_until_a_verified_download_replaces_it(
    hub: StandInHub, tmp_path: Path
) -> None:
    plant(tmp_path)
    copy = tmp_path / "data" / "models" / ASKED / "ok.gguf"
    copy.write_bytes(bytes(len(GOOD)))  # its listed size, not its hash
    lying = spec(listed={"lfs": {"sha256": WRONG_SHA256, "size": len(GOOD), "pointerSize": 135}})
    hub.add(HubRepoSpec(repo_id=ASKED, files={"ok.gguf": lying}, commit=COMMIT))
    failed = download(tmp_path)
    assert [type(e) for e in failed.errors] == [FileDamaged]
    assert copy.read_bytes() == bytes(len(GOOD))  # not removed for the Hub's wrong hash

    hub.add(HubRepoSpec(repo_id=ASKED, files={"ok.gguf": spec()}, commit=COMMIT))
    assert download(tmp_path).errors == []
    assert copy.read_bytes() == GOOD


def test_the_stand_in_serves_what_it_lists_when_it_is_honest(
    hub: StandInHub, tmp_path: Path
) -> None:
    """The box and the attempt download an honest listing whole (the hostile cases above
    fail for what they are, not for the harness)."""
    plant(tmp_path)
    files = {"sub/ok.gguf": spec(), "empty.txt": spec(b"", lfs=False)}
    hub.add(HubRepoSpec(repo_id=ASKED, files=files, commit=COMMIT))
    attempt = download(tmp_path)
    assert attempt.errors == []
    got = tmp_path / "data" / "models" / ASKED
    assert (got / "sub" / "ok.gguf").read_bytes() == GOOD
    assert (got / "empty.txt").read_bytes() == b""


# --- through the API: the status a refusal answers, and the model's name ---------------


@pytest.fixture
def api(hub: StandInHub, tmp_path: Path, database_url: str) -> Iterator[tuple[str, Path]]:
    box = tmp_path / "box"
    plant(box)
    with serving(settings_for(box, database_url), ScriptedRuntime()) as url:
        yield url, box


def test_a_listing_that_leaves_the_store_answers_502_naming_the_field(
    api: tuple[str, Path], hub: StandInHub
) -> None:
    url, box = api
    files = {"../../../../outside/new.gguf": spec(), "ok.gguf": spec()}
    hub.add(HubRepoSpec(repo_id=ASKED, files=files, commit=COMMIT))
    before = snapshot(box, skip=("data/",))
    with httpx.Client(base_url=url, timeout=30) as http:
        asked = http.post("/models/download/", json={"model": ASKED})
        variants = http.get("/models/variants/", params={"repo_id": ASKED})
        assert http.get("/models/").json() == []  # nothing registered
    assert asked.status_code == variants.status_code == 502, asked.text
    detail = asked.json()["detail"]
    assert detail.startswith(f"the Hub's answer is refused: {ASKED}: siblings[0].rfilename:")
    assert "has a '..' segment" in detail
    assert snapshot(box, skip=("data/",)) == before


def test_the_model_is_named_and_stored_by_the_repo_id_asked_for(
    api: tuple[str, Path], hub: StandInHub
) -> None:
    url, box = api
    hub.add(
        HubRepoSpec(
            repo_id=ASKED,
            files={"ok.gguf": spec()},
            commit=COMMIT,
            answered_id="someone-else/other-GGUF",
        )
    )
    with Client(base_url=url) as sdk:
        started = sdk.models.download(ASKED, files=["ok.gguf"])
        sdk.models.wait_for_download(started, poll_interval_s=0.1, timeout_s=60)
        model = sdk.models.get_model(started.model_id)
    assert (model.name, model.repo_modelId) == (ASKED, ASKED)
    (file,) = model.m_files
    assert Path(str(file.storage_location)) == box / "data" / "models" / ASKED / "ok.gguf"


def test_a_repo_id_the_hub_cannot_have_answers_422(api: tuple[str, Path], hub: StandInHub) -> None:
    url, _box = api
    with httpx.Client(base_url=url, timeout=30) as http:
        pulled = http.post("/models/download/", json={"model": "../../outside"})
        variants = http.get("/models/variants/", params={"repo_id": "/etc"})
    assert pulled.status_code == variants.status_code == 422
    assert "'../../outside' is not a Hub repo id" in pulled.json()["detail"][0]["msg"]
    assert hub.seen == []

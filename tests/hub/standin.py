"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, for tests: a small real HTTP
server that the real `huggingface_hub` client is pointed at through `HF_ENDPOINT`.

Its JSON bodies are recorded answers of the real Hub API, trimmed to one repo's worth and
with this test's files in them: `GET /api/models?search=…` (list_models), `GET
/api/models/{repo}` and `/api/models/{repo}/revision/{rev}` with `?blobs=true` (model_info with
files_metadata: `siblings[].size`, `blobId`, `lfs.sha256`), and `GET
/api/models/{repo}/tree/{rev}`. Files are served at `/{repo}/resolve/{rev}/{file}` with the
headers huggingface_hub's file_download.py reads (`get_hf_file_metadata`: `X-Repo-Commit`,
`X-Linked-Etag` / `ETag`, `X-Linked-Size`, `Content-Length`) and HTTP Range requests
(`http_get` resumes with `Range: bytes=N-`). Errors carry `X-Error-Code` as the Hub's do
(`RepoNotFound`, `EntryNotFound`), which huggingface_hub turns into its exceptions.

A file is a header plus zeros up to its size, so a listing can hold a 4 GiB GGUF that is never
written anywhere; `throttle` slows one file down (to kill a download half way) and `corrupt`
serves other bytes than the hash the listing publishes.

It can also play a hostile Hub (a compromised mirror, or anyone in the way of plain HTTP):
a repo's listing may answer another repo id (`answered_id`), any commit, and any file name;
a file's `listed` fields replace its true `siblings[]` entry (size, blobId, lfs), `body_size`
serves a body of another length than the listed one, `etag` any ETag header, and
`ignore_range` answers every Range request with the whole file, as a server without range
support does. A file is found by the path the client asks for after the client's own URL
normalisation (a `..` in a name is resolved by the client before it is sent), so a hostile name is
served too. `served` records the bytes each body got out before it ended or the client hung up.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from huggingface_hub import get_session, hf_hub_url

_HASH_LIMIT = 64 * 1024 * 1024  # larger virtual files carry a recorded (never checked) hash


@dataclass
class HubFileSpec:
    head: bytes
    size: int
    lfs: bool = True
    listed: dict[str, Any] = field(default_factory=dict)  # over its true siblings[] fields
    body_size: int | None = None  # bytes its body holds; None: `size`
    etag: str | None = None  # its ETag header; None: the true hash

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file: the head, then zeros."""
        part = self.head[start:end]
        return part + b"\0" * (end - start - len(part))

    @cached_property
    def sha256(self) -> str:
        if self.size > _HASH_LIMIT:
            return hashlib.sha256(self.head).hexdigest()  # stands for the recorded value
        return hashlib.sha256(self.read(0, self.size)).hexdigest()

    @cached_property
    def blob_id(self) -> str:
        if self.lfs:  # the git blob of an LFS file is its pointer file
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            pointer += f"size {self.size}\n"
            data = pointer.encode()
        else:
            data = self.read(0, self.size)
        return hashlib.sha1(
            f"blob {len(data)}\0".encode() + data, usedforsecurity=False
        ).hexdigest()


@dataclass
class HubRepoSpec:
    repo_id: str
    files: dict[str, HubFileSpec]
    commit: str = "7b0a1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b"
    downloads: int = 12345
    likes: int = 67
    tags: tuple[str, ...] = ("gguf", "text-generation", "conversational", "region:us")
    answered_id: str | None = None  # the id its listing answers; None: `repo_id`


@dataclass
class StandInHub:
    repos: dict[str, HubRepoSpec] = field(default_factory=dict)
    throttle: dict[str, float] = field(default_factory=dict)  # file name → bytes per second
    corrupt: set[str] = field(default_factory=set)
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    ignore_range: bool = False
    served: list[tuple[str, int]] = field(default_factory=list)  # file name, body bytes sent
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: HubRepoSpec) -> None:
        self.repos[repo.repo_id] = repo

    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            standin = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def find(self, target: str) -> tuple[HubRepoSpec, str] | None:
        """The repo and file name whose URL, as huggingface_hub builds it and httpx sends it,
        is `target` (the request's path as it arrived)."""
        for repo in self.repos.values():
            for name in repo.files:
                for revision in {"main", repo.commit}:
                    try:
                        url = hf_hub_url(repo.repo_id, name, revision=revision, endpoint=self.url)
                        path = get_session().build_request("GET", url).url.raw_path.decode()
                    except Exception:  # a URL no client can send is never asked for
                        continue
                    if path == target:
                        return repo, name
        return None

    def gets(self, name: str) -> list[dict[str, str]]:
        """Headers of every GET of the file `name`."""
        return [h for method, path, h in self.seen if method == "GET" and path.endswith("/" + name)]


class _Handler(BaseHTTPRequestHandler):
    standin: StandInHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, *, body: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.standin.seen.append(
            (self.command, path, {k.lower(): v for k, v in self.headers.items()})
        )
        query = parse_qs(url.query)
        if path == "/api/models":
            self._search(query)
        elif path.startswith("/api/models/"):
            self._api_model(path.removeprefix("/api/models/"), query)
        elif (found := self.standin.find(self.path)) is not None:
            self._resolve(found[0].repo_id, found[1], body=body)
        elif "/resolve/" in path:
            repo_id, _, rest = path.lstrip("/").partition("/resolve/")
            _revision, _, name = rest.partition("/")
            self._resolve(repo_id, name, body=body)
        else:
            self._error(404, "EntryNotFound", "not found")

    def _search(self, query: dict[str, list[str]]) -> None:
        text = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["100"])[0])
        found = [r for r in self.standin.repos.values() if text in r.repo_id.lower()]
        found.sort(key=lambda r: -r.downloads)
        self._json([_listed(r) for r in found[:limit]])

    def _api_model(self, rest: str, query: dict[str, list[str]]) -> None:
        revision = None
        tree = False
        if "/tree/" in rest:
            rest, _, revision = rest.partition("/tree/")
            tree = True
        elif "/revision/" in rest:
            rest, _, revision = rest.partition("/revision/")
        repo = self.standin.repos.get(rest)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return
        if revision not in (None, "main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        if tree:
            self._json([_tree_entry(name, spec) for name, spec in sorted(repo.files.items())])
            return
        self._json(_info(repo, blobs="blobs" in query))

    def _resolve(self, repo_id: str, name: str, *, body: bool) -> None:
        repo = self.standin.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return
        spec = repo.files.get(name)
        if spec is None:
            self._error(404, "EntryNotFound", f"{name} does not exist", commit=repo.commit)
            return
        etag = spec.etag if spec.etag is not None else (spec.sha256 if spec.lfs else spec.blob_id)
        size = spec.size if spec.body_size is None else spec.body_size
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and not self.standin.ignore_range:
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start = int(first or 0)
            end = min(int(last) + 1, size) if last else size
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if spec.lfs:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(spec.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        rate = self.standin.throttle.get(name)
        chunk = 64 * 1024 if rate is None else max(1024, int(rate / 20))
        position = start
        try:
            while position < end:
                stop = min(position + chunk, end)
                data = spec.read(position, stop)
                if name in self.standin.corrupt:
                    data = bytes(b ^ 0xFF for b in data)
                self.wfile.write(data)
                position = stop
                if rate is not None:
                    time.sleep(len(data) / rate)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.standin.served.append((name, position - start))

    def _json(self, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, *, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


# Recorded shapes (huggingface.co/api/models?search=Qwen2.5-0.5B-Instruct-GGUF and
# /api/models/Qwen/Qwen2.5-0.5B-Instruct-GGUF?blobs=true), with this test's repo in them.
def _listed(repo: HubRepoSpec) -> dict[str, Any]:
    answered = repo.answered_id or repo.repo_id
    return {
        "_id": hashlib.md5(repo.repo_id.encode(), usedforsecurity=False).hexdigest()[:24],
        "id": answered,
        "likes": repo.likes,
        "trendingScore": 1,
        "private": False,
        "downloads": repo.downloads,
        "tags": list(repo.tags),
        "pipeline_tag": "text-generation",
        "library_name": "gguf",
        "createdAt": "2024-09-17T13:56:08.000Z",
        "modelId": answered,
    }


def _info(repo: HubRepoSpec, *, blobs: bool) -> dict[str, Any]:
    siblings = []
    for name, spec in sorted(repo.files.items()):
        sibling: dict[str, Any] = {"rfilename": name}
        if blobs:
            sibling |= {"blobId": spec.blob_id, "size": spec.size}
            if spec.lfs:
                sibling["lfs"] = {"sha256": spec.sha256, "size": spec.size, "pointerSize": 135}
            sibling |= spec.listed
        siblings.append(sibling)
    return {
        **_listed(repo),
        "author": (repo.answered_id or repo.repo_id).split("/")[0],
        "sha": repo.commit,
        "lastModified": "2024-09-20T12:02:44.000Z",
        "gated": False,
        "disabled": False,
        "cardData": {
            "license": "apache-2.0",
            "language": ["en"],
            "pipeline_tag": "text-generation",
        },
        "siblings": siblings,
        "spaces": [],
        "usedStorage": sum(spec.size for spec in repo.files.values()),
    }


def _tree_entry(name: str, spec: HubFileSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": spec.blob_id, "size": spec.size, "path": name}
    if spec.lfs:
        entry["lfs"] = {"oid": spec.sha256, "size": spec.size, "pointerSize": 135}
    return entry

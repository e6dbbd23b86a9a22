"""Regenerate the committed gRPC stubs from api.proto (grpcio-tools bundles protoc, so this
runs offline): `python -m cohabit.kube.deviceplugin.generate`, then `ruff format` them.
`regenerate` serves every package of protos: each proto's stubs are named after it
(`<name>_pb2.py`, `<name>_pb2_grpc.py`), and their one absolute import each is made
package-relative so they load from their package."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
HEADER = (
    "# ruff: noqa\n# mypy: ignore-errors\n# Generated from {proto} by generate.py; do not edit.\n"
)


def regenerate(folder: Path, names: Sequence[str]) -> None:
    """Stubs for `<folder>/<name>.proto`, each of `names`, written beside them."""
    from grpc_tools import protoc  # a build-time tool, not a runtime dependency

    for name in names:
        proto = f"{name}.proto"
        code = protoc.main(
            [
                "protoc",
                f"-I{folder}",
                f"--python_out={folder}",
                f"--grpc_python_out={folder}",
                proto,
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {proto} with exit code {code}")
        for stub in (f"{name}_pb2.py", f"{name}_pb2_grpc.py"):
            path = folder / stub
            text = path.read_text().replace(f"import {name}_pb2 as", f"from . import {name}_pb2 as")
            path.write_text(HEADER.format(proto=proto) + text)


def main() -> None:
    regenerate(HERE, ["api"])


if __name__ == "__main__":
    main()

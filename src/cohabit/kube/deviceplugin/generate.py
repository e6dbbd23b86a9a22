"""Regenerate the committed gRPC stubs from api.proto (grpcio-tools bundles protoc, so this
runs offline): `python -m cohabit.kube.deviceplugin.generate`, then `ruff format` them. The
stubs' one absolute import is made package-relative so they load from this package."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
HEADER = (
    "# ruff: noqa\n# mypy: ignore-errors\n# Generated from api.proto by generate.py; do not edit.\n"
)


def main() -> None:
    from grpc_tools import protoc  # a build-time tool, not a runtime dependency

    code = protoc.main(
        [
            "protoc",
            f"-I{HERE}",
            f"--python_out={HERE}",
            f"--grpc_python_out={HERE}",
            "api.proto",
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        path = HERE / name
        text = path.read_text().replace("import api_pb2 as", "from . import api_pb2 as")
        path.write_text(HEADER + text)


if __name__ == "__main__":
    main()

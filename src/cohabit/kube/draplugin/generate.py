"""Regenerate the committed gRPC stubs from dra.proto and registration.proto (grpcio-tools
bundles protoc, so this runs offline): `python -m cohabit.kube.draplugin.generate`, then
`ruff format` them (dra_pb2.py, registration_pb2.py and their _grpc modules)."""

from __future__ import annotations

from pathlib import Path

from cohabit.kube.deviceplugin.generate import regenerate

HERE = Path(__file__).parent


def main() -> None:
    regenerate(HERE, ["dra", "registration"])


if __name__ == "__main__":
    main()

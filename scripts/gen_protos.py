"""Regenerate the gRPC stubs in testbed/grpcapi from its .proto files (`make protos`).

The generated modules are committed so installing the project needs no protoc; the
protobuf runtime must be at least the version that generated them (see pyproject).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
API_DIR = ROOT / "testbed" / "grpcapi"


def main() -> int:
    protos = sorted(p.relative_to(ROOT).as_posix() for p in API_DIR.glob("*.proto"))
    for proto in protos:
        code = protoc.main(
            [
                "protoc",
                f"-I{ROOT}",
                f"--python_out={ROOT}",
                f"--pyi_out={ROOT}",
                f"--grpc_python_out={ROOT}",
                proto,
            ]
        )
        if code != 0:
            print(f"protoc failed on {proto}", file=sys.stderr)
            return code
    print(f"generated stubs for {len(protos)} protos in {API_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

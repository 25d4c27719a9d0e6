"""Writes the protobuf modules of proto/cairn/v1 into src/cairn_client/_pb (messages and their
.pyi types; no grpc stubs: the client names its methods itself). With --check, generates into a
temporary directory and fails when the committed files differ (run by run-tests.sh).

Needs grpcio-tools == GRPCIO_TOOLS (the protobuf version of the generated code is that of the
protoc inside it; pyproject.toml asks for a runtime at least as new)."""

from __future__ import annotations

import filecmp
import re
import subprocess
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS = "1.85.1"
HERE = Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "proto"
OUT = HERE / "src" / "cairn_client" / "_pb"
PACKAGE = "cairn_client._pb"


def generate(out: Path) -> list[Path]:
    from importlib.metadata import version

    have = version("grpcio-tools")
    if have != GRPCIO_TOOLS:
        sys.exit(
            f"grpcio-tools {have} is installed; the stubs are made with {GRPCIO_TOOLS}: "
            f"pip install grpcio-tools=={GRPCIO_TOOLS}"
        )
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "cairn" / "v1").glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            *protos,
        ],
        check=True,
    )
    files = []
    for path in sorted((out / "cairn" / "v1").glob("*_pb2.py*")):
        text = path.read_text()
        # The modules import each other as `cairn.v1`; inside this package they are under _pb.
        text = re.sub(
            r"^from cairn\.v1 import", f"from {PACKAGE}.cairn.v1 import", text, flags=re.MULTILINE
        )
        path.write_text(text)
        files.append(path)
    for pkg in (out, out / "cairn", out / "cairn" / "v1"):
        (pkg / "__init__.py").write_text(
            '"""Generated from proto/ by gen_stubs.py; do not edit."""\n'
        )
        files.append(pkg / "__init__.py")
    return files


def main() -> None:
    if "--check" not in sys.argv:
        generate(OUT)
        print(f"wrote {OUT}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [
            str(p.relative_to(tmp))
            for p in fresh
            if not (OUT / p.relative_to(tmp)).is_file()
            or not filecmp.cmp(p, OUT / p.relative_to(tmp), shallow=False)
        ]
        committed = {
            str(p.relative_to(OUT)) for p in OUT.rglob("*.py*") if "__pycache__" not in p.parts
        }
        extra = sorted(committed - {str(p.relative_to(tmp)) for p in fresh})
    if stale or extra:
        sys.exit(
            f"the generated stubs differ from proto/ ({', '.join(stale + extra)}): "
            "run `python clients/python/gen_stubs.py` and commit src/cairn_client/_pb"
        )
    print("stubs match proto/")


if __name__ == "__main__":
    main()

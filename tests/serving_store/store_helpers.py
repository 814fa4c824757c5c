"""Helpers for tests/serving_store: hand-built tarballs, free ports, directory listings."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from serving.triton.base import free_ports

CONFIG = 'backend: "python"\nmax_batch_size: 4\n'
ENSEMBLE_CONFIG = """platform: "ensemble"
max_batch_size: 4
ensemble_scheduling {
  step { model_name: "pre" model_version: -1 input_map { key: "IN" value: "x" } output_map { key: "OUT" value: "y" } }
  step { model_name: "net" model_version: -1 input_map { key: "IN" value: "y" } output_map { key: "OUT" value: "z" } }
}
"""


@dataclass(frozen=True)
class Member:
    """One tar member to write: a file (data), directory, link or special file."""

    name: str
    data: bytes | None = None
    kind: bytes = tarfile.REGTYPE
    linkname: str = ""
    size: int | None = None  # header size override (lie about the size)


def write_tarball(path: Path, members: list[Member], compress: bool = True) -> Path:
    """A tar.gz with exactly these members, in this order, nothing normalised away."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = m.kind
            info.linkname = m.linkname
            info.mode = 0o755 if m.kind == tarfile.DIRTYPE else 0o644
            if m.kind == tarfile.REGTYPE:
                data = m.data or b""
                info.size = len(data) if m.size is None else m.size
                tar.addfile(info, io.BytesIO(data) if m.size is None else None)
            else:
                tar.addfile(info)
    payload = raw.getvalue()
    if compress:
        payload = gzip.compress(payload, compresslevel=1, mtime=0)
    path.write_bytes(payload)
    return path


def model_members(name: str = "tiny", config: str = CONFIG) -> list[Member]:
    return [
        Member(name, kind=tarfile.DIRTYPE),
        Member(f"{name}/config.pbtxt", config.encode()),
        Member(f"{name}/1", kind=tarfile.DIRTYPE),
        Member(f"{name}/1/model.py", b"class TritonPythonModel:\n    pass\n"),
    ]


def free_port() -> int:
    return free_ports(1)[0]


def tree(root: Path) -> list[str]:
    """Every path under root, relative, sorted (for 'nothing left behind' checks)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))

"""What ``mme package`` is asked to do: one typed record (:class:`PackageRequest`), whichever
way it was asked (a command line or a catalogue entry: :mod:`packager.options` builds it), that
the pipeline packages and a catalogue entry's child process reads from its request file
(:meth:`PackageRequest.to_dict` / :meth:`PackageRequest.from_dict`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mme import __version__
from packager.formats.base import ExportOptions
from packager.model import ModelRequest
from packager.triton_options import TritonOptions

REQUEST_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PackageRequest:
    model: ModelRequest
    formats: tuple[str, ...]
    out: Path
    family: str | None = None
    export: ExportOptions = field(default_factory=ExportOptions)
    triton: TritonOptions = field(default_factory=TritonOptions)
    atol: float | None = None
    rtol: float | None = None  # None: the format's default (the family's, looser for tf32/fp16 engines)
    triton_release: str | None = None
    with_tokenizer: bool = False  # text models: an ensemble of the packaged tokenizer + the encoder (TEXT in)

    def to_dict(self) -> dict[str, Any]:
        """JSON types only (paths as strings, tuples as lists), with a schema version."""
        return {"schema_version": REQUEST_SCHEMA_VERSION,
                **json.loads(json.dumps(dataclasses.asdict(self), default=str))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PackageRequest":
        """The request :meth:`to_dict` wrote (ValueError for another schema version)."""
        if data.get("schema_version") != REQUEST_SCHEMA_VERSION:
            raise ValueError(f"a package request of schema version {data.get('schema_version')!r}; this mme reads "
                             f"version {REQUEST_SCHEMA_VERSION}")
        model = dict(data["model"])
        if model.get("weights_path") is not None:
            model["weights_path"] = Path(model["weights_path"])
        triton = dict(data["triton"])
        triton["preferred_batch_sizes"] = tuple(triton["preferred_batch_sizes"])
        rest = {k: v for k, v in data.items() if k not in ("schema_version", "model", "formats", "out", "export",
                                                           "triton")}
        return cls(model=ModelRequest(**model), formats=tuple(data["formats"]), out=Path(data["out"]),
                   export=ExportOptions(**data["export"]), triton=TritonOptions(**triton), **rest)


def request_fingerprint(request: PackageRequest) -> str:
    """sha256 of everything that shapes the artifacts of ``request`` (all but where they go) and
    of this toolkit's version: ``mme package --catalogue`` skips an entry whose manifests carry it."""
    options = dataclasses.asdict(request)
    options.pop("out")
    document = json.dumps({"request": options, "mme-toolkit": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(document.encode()).hexdigest()

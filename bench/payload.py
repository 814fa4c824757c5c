"""The request body every bench request sends, and its content type.

From an artifact made by ``mme package`` (the manifest's sample request: KServe v2 JSON, or
the binary+json body with ``--binary``), from a file, or for a real-time endpoint the second
article's ``{"inputs": "..."}`` JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mme.errors import MmeError, UsageError
from packager.manifest import Manifest
from serving.runtime.errors_sagemaker import MAX_PAYLOAD_BYTES

JSON = "application/json"
SINGLE_MODEL_DEFAULT = json.dumps({"inputs": "I am super happy right now."}).encode()


@dataclass(frozen=True)
class Payload:
    body: bytes
    content_type: str
    source: str  # where it came from, for run.json
    model: str | None = None  # the artifact's model name, when from an artifact
    format: str | None = None  # the artifact's format


def from_artifact(directory: Path, binary: bool = False) -> Payload:
    if not directory.is_dir():
        raise MmeError(f"--artifact {directory} is not a directory; point at artifacts/<model>/<format> made by 'mme package'")
    manifest = Manifest.load(directory)
    sample = manifest.sample_request
    name = sample.binary_file if binary else sample.json_file
    body = _read(directory / name, f"the artifact's sample request {name}; re-run 'mme package'")
    content_type = sample.binary_content_type if binary else JSON
    return _checked(Payload(body, content_type, str(directory / name), manifest.model, manifest.format))


def from_file(path: Path, content_type: str | None) -> Payload:
    body = _read(path, "--payload")
    if content_type is None:
        if path.suffix.lower() != ".json":
            raise UsageError(f"--payload {path}: give its --content-type (only .json files default to {JSON})")
        content_type = JSON
    return _checked(Payload(body, content_type, str(path)))


def default_single_model() -> Payload:
    return Payload(SINGLE_MODEL_DEFAULT, JSON, "default {\"inputs\": ...} JSON")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise MmeError(f"{path} does not exist ({what})") from None
    except IsADirectoryError:
        raise MmeError(f"{path} is a directory, not a file ({what})") from None
    except OSError as exc:
        raise MmeError(f"cannot read {path} ({exc.strerror})") from None


def _checked(payload: Payload) -> Payload:
    if not payload.body:
        raise MmeError(f"payload {payload.source} is empty")
    if len(payload.body) > MAX_PAYLOAD_BYTES:
        raise MmeError(f"payload {payload.source} is {len(payload.body)} bytes; InvokeEndpoint accepts at most "
                       f"{MAX_PAYLOAD_BYTES} bytes")
    if not payload.content_type.isprintable() or "\n" in payload.content_type:
        raise UsageError(f"--content-type {payload.content_type!r} is not a valid header value")
    return payload

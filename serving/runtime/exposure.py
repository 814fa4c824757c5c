"""What the local endpoint tells its user about who and what it exposes, and how to call it.

Two warnings: a front bound to an address other than loopback answers anyone who can reach
it (unless ``--require-signature``), said once, loudly, at start; and a python-backend model
fetched from an S3 prefix runs its ``model.py`` in the user's own environment under every
server kind that does not run Triton in a container (all but docker), said once per target
before it first loads. And the banner's lines: the targets served, a command that invokes them.
"""

from __future__ import annotations

import shlex
import threading
from pathlib import Path
from typing import Callable

from packager.manifest import Manifest, is_artifact_directory
from packager.triton_config import ModelConfigError, read_config
from serving.models.extract import CONFIG_NAME
from serving.runtime.sigv4_verify import ACCESS_KEY_ENV, SECRET_KEY_ENV
from serving.triton.factory import SERVER_KINDS

MAX_TARGETS_SHOWN = 6


def open_front_warning(host: str, port: int | None) -> str:
    """The start-up warning for a front on ``host`` that answers unsigned or any-key requests."""
    where = f"{host}:{port}" if port is not None else host
    return (f"the endpoint listens on {where}, not on loopback, and verifies no signature: anyone who can reach this "
            "address can invoke models, make it download, load and evict any model under --models, and read /metrics "
            "and /models. Restrict it with --require-signature --access-key-id KEY --secret-access-key SECRET "
            f"(or {ACCESS_KEY_ENV} / {SECRET_KEY_ENV}), or bind --host 127.0.0.1")


def python_backend_models(model_dir: Path) -> tuple[str, ...]:
    """The model directories under an extracted target whose config.pbtxt says ``backend: "python"``."""
    found = []
    for config in sorted(Path(model_dir).glob(f"*/{CONFIG_NAME}")):
        try:
            backend = read_config(config).backend
        except ModelConfigError:
            continue  # the extraction already refused invalid configs; Triton reports any other
        if backend == "python":
            found.append(config.parent.name)
    return tuple(found)


def python_backend_warning(target: str, source_uri: str) -> str:
    isolating = " or ".join(kind.name for kind in SERVER_KINDS.values() if kind.in_container)
    return (f"{target} is a python-backend model from {source_uri}: its model.py runs as you, with your files and "
            f"credentials (the {isolating} server kind isolates it)")


class PythonBackendWarner:
    """Warns once per target, before its first load, that a python-backend model from
    ``source_uri`` runs unisolated. Called by the cache after each fetch (from any thread)."""

    def __init__(self, source_uri: str, warn: Callable[[str], None]) -> None:
        self.source_uri = source_uri
        self._warn = warn
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, target: str, model_dir: Path) -> None:
        with self._lock:
            if target in self._seen:
                return
            self._seen.add(target)
        if python_backend_models(model_dir):
            self._warn(python_backend_warning(target, self.source_uri))


def targets_text(targets: tuple[str, ...]) -> str:
    """The names the endpoint answers for, a few of them when there are many."""
    shown = ", ".join(targets[:MAX_TARGETS_SHOWN])
    return shown + (f" and {len(targets) - MAX_TARGETS_SHOWN} more" if len(targets) > MAX_TARGETS_SHOWN else "")


def client_example(endpoint, options) -> str:
    """A command that invokes the endpoint (a LocalEndpoint or LocalFleet started with ``options``)
    as shown: boto3 with the region and keys it needs, the first target and, for an artifact
    directory, its sample request."""

    body, content_type = "b'...your request body...'", "application/json"
    directory = Path(options.models.removeprefix("file://"))
    if directory.is_file():  # a real-time endpoint's tarball: its artifact directory, if it is in one
        directory = directory.parent
    if not options.models.startswith("s3://") and is_artifact_directory(directory):
        sample = Manifest.load(directory).sample_request
        body = f"open({str(directory / sample.json_file)!r}, 'rb').read()"
    secret = (f"os.environ['{SECRET_KEY_ENV}']" if options.require_signature else "'local'")
    target = endpoint.targets[0] if endpoint.targets else "<name>.tar.gz"
    target_arg = "" if endpoint.model is not None else f"TargetModel='{target}', "  # real-time: none
    key = repr(options.access_key_id) if options.require_signature else "'local'"
    code = (f"import boto3, os; r = boto3.client('sagemaker-runtime', endpoint_url='{endpoint.url}', "
            f"region_name='{options.region}', aws_access_key_id={key}, aws_secret_access_key={secret})"
            f".invoke_endpoint(EndpointName='{options.endpoint_name}', {target_arg}"
            f"ContentType='{content_type}', Body={body}); print(r['Body'].read()[:300])")
    return f"python -c {shlex.quote(code)}"

"""What the local endpoint tells its user about who and what it exposes.

Two warnings: a front bound to an address other than loopback answers anyone who can reach
it (unless ``--require-signature``), said once, loudly, at start; and a python-backend model
fetched from an S3 prefix runs its ``model.py`` in the user's own environment under every
server kind but docker, said once per target before it first loads.
"""

from __future__ import annotations

import ipaddress
import threading
from pathlib import Path
from typing import Callable

from packager.triton_config import ModelConfigError, read_config

CONFIG_NAME = "config.pbtxt"


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach: ``localhost``, 127.0.0.0/8, ::1.
    Any other name or address (0.0.0.0, ::, a LAN address, a host name) is not."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def open_front_warning(host: str, port: int | None) -> str:
    """The start-up warning for a front on ``host`` that answers unsigned or any-key requests."""
    where = f"{host}:{port}" if port is not None else host
    return (f"the endpoint listens on {where}, not on loopback, and verifies no signature: anyone who can reach this "
            "address can invoke models, make it download, load and evict any model under --models, and read /metrics "
            "and /models. Restrict it with --require-signature --access-key-id KEY --secret-access-key SECRET "
            "(or MME_SERVE_ACCESS_KEY_ID / MME_SERVE_SECRET_ACCESS_KEY), or bind --host 127.0.0.1")


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
    return (f"{target} is a python-backend model from {source_uri}: its model.py runs as you, with your files and "
            "credentials (the docker server kind isolates it)")


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

"""Reaching model hubs: a fast reachability check before any download is attempted.

Without it, huggingface_hub retries for 25-45 s before giving up on a machine with no
route to the hub. When the hub is unreachable we switch the libraries to offline mode
(their documented HF_HUB_OFFLINE switch, set before they are imported) so weights
already in the local cache still load, and anything else fails at once.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def use_offline_mode() -> None:
    """Make huggingface_hub, timm and transformers use only the local cache."""
    os.environ["HF_HUB_OFFLINE"] = "1"

"""Addresses: which ones only this machine can reach (the front's and the load test master's
binding checks share the rule)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach: ``localhost``, 127.0.0.0/8, ::1.
    Any other name or address (0.0.0.0, ::, a LAN address, a host name that may resolve to any
    address) is not."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False

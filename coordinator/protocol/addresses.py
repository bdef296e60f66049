"""Network addresses as the cluster's processes name them: host:port strings, and which hosts only this machine
can reach (what may go unguarded: an admin API without a token, a direct link without the cluster secret)."""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def is_loopback(host: str) -> bool:
    """True for a name or address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


WILDCARDS = ("0.0.0.0", "::", "")


def advertised(host: str, chosen: str | None = None) -> str:
    """The address others reach a listener bound to `host` at: `chosen`, else `host` (this host's name for a
    wildcard bind)."""
    return chosen or (socket.getfqdn() if host in WILDCARDS else host)


def may_listen_unauthenticated(host: str, advertise: str) -> bool:
    """Without the cluster secret a direct link listens only where no other host can reach it."""
    return is_loopback(host) and is_loopback(advertise)


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"link address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

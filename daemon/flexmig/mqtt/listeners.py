"""The other doors of the broker: every socket the broker process that serves flexmig listens on, on this machine.

A broker may listen more than once (mosquitto's ``listener`` lines), and with ``per_listener_settings true`` each
listener has its own login rules and ACL: one that flexmig's account reaches may keep strangers off the command
topics while a second one lets anonymous clients publish anywhere. Probing the listener flexmig uses proves nothing
about the others, so the command guard (:mod:`flexmig.mqtt.command_guard`) probes every one found here.

They are found from the kernel's socket tables (psutil, as root): the process listening on the broker's port at its
address (or on every address) is the broker, and every TCP and Unix socket it listens on is a door. A broker on
another machine cannot be seen from here: :func:`broker_listeners` then returns None, and the guard says so.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import psutil

from flexmig.config import HostPort

__all__ = ["Listener", "broker_listeners"]

_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 - a listener on every address is reached on loopback


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket of the broker: TCP ``host``:``port``, or a Unix socket at ``path``."""

    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def broker_listeners(broker: HostPort) -> list[Listener] | None:
    """Every listener of the broker serving ``broker``, when that broker runs on this machine (the one flexmig
    connects to among them); None when no process here listens there (a broker elsewhere, or one this process
    may not see). Blocks (reads /proc): called off the event loop."""
    try:
        addresses = {str(ai[4][0]) for ai in socket.getaddrinfo(broker.host, broker.port, type=socket.SOCK_STREAM)}
    except OSError:
        return None
    owner = None
    try:
        for c in psutil.net_connections("inet"):
            if c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port != broker.port or not c.pid:
                continue
            if c.laddr.ip in addresses or c.laddr.ip in _ANY:
                owner = c.pid
                break
        if owner is None:
            return None
        proc = psutil.Process(owner)
        found = {
            Listener(_ANY.get(c.laddr.ip, c.laddr.ip), c.laddr.port)
            for c in proc.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr
        }
        found |= {
            Listener(path=str(c.laddr))
            for c in proc.net_connections("unix")
            if isinstance(c.laddr, str) and c.laddr.startswith("/") and not c.raddr
        }
    except psutil.Error:
        return None
    return sorted(found, key=lambda x: (x.path, x.host, x.port))

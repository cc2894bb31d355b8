"""Network addresses in the configuration: ``host:port``, with the loopback rule that keeps endpoints local."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from flexmig.config.problems import show

__all__ = ["HostPort"]


@dataclass(frozen=True)
class HostPort:
    """A ``host:port`` address; IPv6 hosts are written in brackets (``[::1]:9400``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """Parse ``host:port``; raises ``ValueError`` saying what is wrong (the caller adds file, key, line)."""
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", text)
        if not m:
            raise ValueError(f"{show(text)} is not host:port (write IPv6 hosts in brackets: [::1]:9400)")
        host = m.group(1) or m.group(3)
        port = int(m.group(2) or m.group(4))
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1-65535")
        if m.group(1):
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{show(host)} is not an IPv6 address") from None
        elif not _is_ipv4(host) and not re.fullmatch(
            r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
            host,
        ):
            raise ValueError(f"{show(host)} is neither an IP address nor a host name")
        return cls(host, port)

    def is_loopback(self) -> bool:
        """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1): only this machine can connect."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True

"""Listening TCP sockets of this network namespace, read from /proc (what `ss -ltn` shows).

SPEC 15: everything listens on loopback only. Processes in containers on the host's network
share this namespace, so their sockets are here too.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    inode: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc prints IPv6 as four host-order 32-bit words
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    v6 = ipaddress.IPv6Address(words)
    return str(v6.ipv4_mapped or v6)


def listeners() -> set[Listener]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            found.add(Listener(_address(address), int(port, 16), int(fields[9])))
    return found


def owner(listener: Listener) -> int | None:
    """The process that holds a listening socket (None if gone or not visible)."""
    wanted = f"socket:[{listener.inode}]"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if str(fd.readlink()) == wanted:
                    return int(entry.name)
        except OSError:
            continue
    return None


def of_process_group(pid: int) -> set[Listener]:
    """The listening sockets held by `pid`'s process group (a server and the processes it started)."""
    group = os.getpgid(pid)
    mine = set()
    for listener in listeners():
        holder = owner(listener)
        if holder is not None:
            try:
                if os.getpgid(holder) == group:
                    mine.add(listener)
            except OSError:
                continue
    return mine

"""Processes and ports for the benches that start a server of their own."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_tree(pid: int) -> list[int]:
    """`pid` and every process under it (a process that ends meanwhile is skipped)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    children = Path(f"/proc/{current}/task/{task}/children").read_text()
                    queue.extend(int(c) for c in children.split())
    return found

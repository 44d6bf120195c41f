"""Ports for the Ray heads tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port no one listens on now (chosen by the kernel): two test runs on one machine
    must not both start a Ray head on a fixed port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]

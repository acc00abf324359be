"""A port on the loopback interface that nothing listens on, for tests that start a server of their own."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port free at the moment of the call (another process may take it before it is used)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

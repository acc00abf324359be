"""This host's network interfaces: which address each has, which interface holds an address, and which
address the routes use towards another host."""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every interface that has one, by interface name."""
    addresses = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        addresses[name] = socket.inet_ntoa(packed[20:24])
    return addresses


def route_source(address: str) -> str | None:
    """This host's source address for packets to ``address`` (what the kernel's routes pick; nothing is
    sent), None when there is no route or ``address`` is not an IPv4 address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
            return probe.getsockname()[0]
        except OSError:
            return None


def interface_of(address: str) -> str | None:
    """The interface that holds ``address``, if one of this host's does."""
    return next((name for name, ip in interface_addresses().items() if ip == address), None)


def address_of(interface: str) -> str:
    """The IPv4 address of ``interface``; ``ValueError`` naming the interfaces there are otherwise."""
    addresses = interface_addresses()
    if interface not in addresses:
        known = ", ".join(f"{name} ({ip})" for name, ip in sorted(addresses.items())) or "none"
        raise ValueError(f"--network-interface {interface}: no such interface with an IPv4 address on this host "
                         f"(interfaces: {known})")
    return addresses[interface]

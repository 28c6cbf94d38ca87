"""Choose the network interface of a run and check the rendezvous endpoint before torchrun waits on it."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "PEER_GONE",
    "is_follow_on",
    "LauncherNetwork",
    "NetworkError",
    "NetworkPlan",
    "interface_addresses",
    "interface_of",
    "launcher_network",
    "loopback_interface",
    "lost_peer",
    "plan_network",
    "probe_endpoint",
    "resolve_host",
    "route_source",
    "socket_env",
    "split_endpoint",
]

SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
"""Where gloo, NCCL's bootstrap and tensorpipe read the interface to bind; without them gloo binds
the address its hostname resolves to, which on most machines is the LAN address."""


class NetworkError(ValueError):
    """The endpoint or interface of a run cannot work; the message names host, port and interface."""


@dataclass(frozen=True, kw_only=True)
class NetworkPlan:
    """Where this node's sockets go."""

    iface: str
    """Interface the ranks' collectives bind to."""
    address: str
    """This node's address on `iface` (advertised to the other nodes as --local-addr)."""
    is_host: bool
    """True when this node hosts the rendezvous store (the endpoint is one of its addresses)."""
    env: dict[str, str] = field(default_factory=dict)
    """Socket variables to add to the ranks' environment (only those the user has not set)."""


def socket_env(iface: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The SOCKET_IFNAME_VARS naming `iface`, except those the user has set in `environ`."""
    return {name: iface for name in SOCKET_IFNAME_VARS if name not in environ}


def split_endpoint(endpoint: str, *, setting: str = "--rdzv-endpoint") -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port); a missing or bad port is an error naming the fix."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port:
        raise NetworkError(f"{setting} {endpoint!r} has no port; pass HOST:PORT, e.g. {endpoint or 'node0'}:29400")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise NetworkError(f"{setting} {endpoint!r}: port {port!r} is not a number in 0..65535; pass e.g. {host}:29400")
    return host, int(port)


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its IPv4/IPv6 addresses on this machine."""
    try:
        import psutil
    except ImportError:
        return _addresses_without_psutil()
    return {name: [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
            for name, addrs in psutil.net_if_addrs().items()}


def _addresses_without_psutil() -> dict[str, list[str]]:
    """IPv4 addresses through the SIOCGIFADDR ioctl (Linux), for installs without psutil."""
    import fcntl
    import struct

    out: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                out[name] = [socket.inet_ntoa(raw[20:24])]
            except OSError:  # an interface without an IPv4 address
                out[name] = []
    return out


def interface_of(address: str, addresses: Mapping[str, list[str]]) -> str | None:
    """The interface that holds `address`, or None."""
    for name, addrs in addresses.items():
        if address in addrs:
            return name
    return None


def loopback_interface(addresses: Mapping[str, list[str]] | None = None) -> str:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS)."""
    addresses = interface_addresses() if addresses is None else addresses
    return interface_of("127.0.0.1", addresses) or interface_of("::1", addresses) or "lo"


def resolve_host(host: str, port: int) -> list[str]:
    """Addresses of `host` (DNS or /etc/hosts); an unresolvable name is an error, not a hang."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NetworkError(
            f"--rdzv-endpoint {host}:{port}: host {host!r} does not resolve ({e.strerror}); "
            "pass the name or IP address of the rendezvous node that every node can resolve"
        ) from None
    return list(dict.fromkeys(info[4][0] for info in infos))


def route_source(address: str, port: int) -> str:
    """This machine's source address for packets to `address`: a UDP connect() sends nothing, it only routes."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, port or 9))
        except OSError as e:
            raise NetworkError(
                f"--rdzv-endpoint {address}:{port}: no route from this node ({e.strerror}); "
                "check the address, or pass --iface NAME for the network that reaches it"
            ) from None
        return s.getsockname()[0]


def plan_network(host: str, port: int, *, iface: str | None, node_rank: int | None,
                 environ: Mapping[str, str], addresses: Mapping[str, list[str]] | None = None,
                 resolved: list[str] | None = None) -> NetworkPlan:
    """Interface, advertised address and socket variables of a multi-node launcher.

    `iface` (the user's --iface) wins; otherwise the interface that routes to the endpoint.
    """
    addresses = interface_addresses() if addresses is None else addresses
    resolved = resolve_host(host, port) if resolved is None else resolved
    local = {a for addrs in addresses.values() for a in addrs}
    if all(ipaddress.ip_address(a).is_loopback for a in resolved):
        is_host = node_rank in (None, 0)  # several "nodes" on one machine: node 0 hosts
    else:
        # The machine that holds the endpoint's address hosts it, whatever node rank it was given.
        is_host = any(a in local for a in resolved)
    if iface is not None:
        if iface not in addresses:
            raise NetworkError(f"--iface {iface!r} is not an interface of this node; pick one of "
                               f"{', '.join(sorted(addresses))}")
        if not addresses[iface]:
            raise NetworkError(f"--iface {iface!r} has no IP address; pick one of {', '.join(sorted(addresses))}")
        v4 = [a for a in addresses[iface] if ":" not in a]
        address = (v4 or addresses[iface])[0]
    else:
        address = route_source(resolved[0], port)
        iface = interface_of(address, addresses)
        if iface is None:
            raise NetworkError(f"--rdzv-endpoint {host}:{port} is reached from {address}, which no interface "
                               "holds; pass --iface NAME")
    return NetworkPlan(iface=iface, address=address, is_host=is_host, env=socket_env(iface, environ))


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")
"""How gloo and NCCL say that a peer left: the last line of a rank that failed only because another one did."""


def is_follow_on(message: str | None) -> bool:
    """Whether a rank's error (its last line) is the echo of a peer's failure rather than a cause of its own."""
    lines = (message or "").strip().splitlines()
    return bool(lines) and any(words in lines[-1] for words in PEER_GONE)


_PEER_LOST = re.compile(r"(?:Connection reset by peer|Connection closed by peer|Read error|Write error)"
                        r"[^\[]*\[([^\]]+)\]:\d+|\[([^\]]+)\]:\d+[^\n]*(?:Connection reset|Connection closed)")


@dataclass(frozen=True, kw_only=True)
class LauncherNetwork:
    """Where one `ddpkit run` launcher's sockets go, and its stores' binding."""

    env: dict[str, str]
    """Socket variables for the ranks' environment (`socket_env`)."""
    local_addr: str | None = None
    """The address this node advertises, when the user named its interface; None: torchrun's choice."""
    bind_addr: str | None = None
    """The stores this launcher hosts listen on this address only; None: torch's default (every interface)."""
    is_host: bool | None = None
    """Whether this node hosts the rendezvous store; None: torch decides (by trying to bind the endpoint)."""


def launcher_network(rdzv_endpoint: str | None, *, single_node: bool, iface: str | None, node_rank: int | None,
                     connect_timeout_s: float, environ: Mapping[str, str]) -> LauncherNetwork:
    """The network of one launcher (raises NetworkError naming the fix).

    One node: everything on loopback, including gloo's sockets, which otherwise bind the address the
    hostname resolves to. Several nodes: the interface the user names (--iface) or the one that routes
    to the endpoint, and a pre-flight connect so a wrong endpoint fails now instead of hanging.
    """
    if single_node:
        return LauncherNetwork(env=socket_env(loopback_interface(), environ), bind_addr="127.0.0.1", is_host=True)
    host, port = split_endpoint(rdzv_endpoint or "")
    plan = plan_network(host, port, iface=iface, node_rank=node_rank, environ=environ)
    if not plan.is_host:
        probe_endpoint(host, port, iface=plan.iface, timeout_s=connect_timeout_s)
    if iface is not None:
        # The user named the network: the stores this node hosts listen there only, and the node
        # advertises its address on it (where rank 0's node puts the ranks' store).
        return LauncherNetwork(env=plan.env, local_addr=plan.address, bind_addr=plan.address, is_host=plan.is_host)
    return LauncherNetwork(env=plan.env, is_host=plan.is_host if node_rank is not None else None)


def lost_peer(message: str) -> str | None:
    """The address of the peer whose connection a gloo error reports as dropped, or None."""
    match = _PEER_LOST.search(message)
    if match is None:
        return None
    return match.group(1) or match.group(2)


def probe_endpoint(host: str, port: int, *, iface: str, timeout_s: float, interval_s: float = 0.25) -> None:
    """Connect to the rendezvous store once before torchrun does; fail with a clear message, not a hang.

    A refused connection is retried until `timeout_s` (the host node may still be starting);
    an unreachable network, or no answer at all within the time, fails at once with host, port and iface.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(left, 5.0))):
                return
        except socket.timeout:
            last = "no answer (a firewall dropping packets, or the wrong address)"
        except ConnectionRefusedError:
            last = "connection refused (nothing listens there yet: is node 0 running `ddpkit run`?)"
        except OSError as e:
            if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                last = f"{e.strerror} (wrong network or address)"
                left = 0
            else:
                last = e.strerror or str(e)
        if left <= interval_s:
            raise NetworkError(
                f"--rdzv-endpoint {host}:{port} is not reachable from this node over interface {iface}: "
                f"{last} after {timeout_s:g}s; start node 0 first, check the host and port, or pass "
                "--iface NAME / --connect-timeout SECONDS"
            )
        time.sleep(interval_s)

"""torchrun's c10d rendezvous with its stores listening on one address, and node ranks that follow --node-rank."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousError, RendezvousTimeoutError

from ddpkit import torchinternals

if TYPE_CHECKING:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

__all__ = ["BACKEND", "NodeMismatchError", "listening_store", "register"]

BACKEND = "ddpkit-c10d"
"""Name of the rendezvous backend `ddpkit run` registers in its own torchrun process.

It is torch's c10d backend plus two settings in --rdzv-conf:
- `bind_addr`: the stores this launcher hosts (the rendezvous store on the host node, the ranks' shared
  store on rank 0's node) listen on that address only. torch's own TCPStore server listens on every
  interface ('*'), so a single-node job would otherwise be reachable from the network.
- `node_rank`: this node's --node-rank. torch orders the nodes of a round by address, then process id,
  so with c10d any node can get global rank 0; ddpkit orders them by --node-rank first.
"""


class NodeMismatchError(RendezvousError):
    """Two nodes of one rendezvous disagree on --nnodes, or share a --node-rank; the message says which."""


@dataclass(eq=True, frozen=True, repr=False)
class _Node(torchinternals.node_desc_base()):
    """torch's node descriptor plus how the node was launched; it travels to the other nodes in the
    rendezvous state (pickled, so every node runs ddpkit).

    torch numbers the participants of a round in sorted order (rendezvous rank = node's group rank; the
    node of group rank 0 holds global ranks 0..nproc-1). Nodes given a --node-rank sort by it, before
    nodes without one; ties and nodes without one keep torch's order (address, pid).
    """

    node_rank: int | None
    nnodes: str

    def _key(self) -> tuple:
        return (self.node_rank is None, self.node_rank or 0, self.addr, self.pid, self.local_id)

    def __lt__(self, other):
        return self._key() < other._key() if isinstance(other, _Node) else NotImplemented

    def __le__(self, other):
        return self._key() <= other._key() if isinstance(other, _Node) else NotImplemented

    def __gt__(self, other):
        return self._key() > other._key() if isinstance(other, _Node) else NotImplemented

    def __ge__(self, other):
        return self._key() >= other._key() if isinstance(other, _Node) else NotImplemented

    def describe(self) -> str:
        rank = f", --node-rank {self.node_rank}" if self.node_rank is not None else ""
        return f"{self.addr} (pid {self.pid}{rank}, --nnodes {self.nnodes})"


def listening_store(addr: str, port: int, *, timeout_s: float) -> TCPStore:
    """A TCPStore server that accepts connections on `addr` only (port 0: the OS picks one)."""
    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(1024)
        bound_port = sock.getsockname()[1]
    except OSError as e:
        sock.close()
        raise RuntimeError(
            f"cannot listen on {addr}:{port} for the rendezvous store ({e.strerror}); pick a free port "
            "for --rdzv-endpoint, or the address of one of this node's interfaces"
        ) from None
    # The store takes the listening socket as it is: binding happens here, on our address, and
    # the fd is handed over (detach) so that Python never closes it under the store.
    return dist.TCPStore(addr, bound_port, is_master=True, master_listen_fd=sock.detach(),
                         wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=timeout_s))


def _create_handler(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend, create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    class Backend(C10dRendezvousBackend):
        """torch's c10d state machine under our name (torchrun checks that the names match)."""

        @property
        def name(self) -> str:
            return BACKEND

    bind_addr = params.get("bind_addr")
    read_timeout = float(params.get_as_int("read_timeout", 60))
    if bind_addr and params.get_as_bool("is_host", False):
        _, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
        store = listening_store(bind_addr, port, timeout_s=read_timeout)
    else:
        _, store = create_backend(params)
    backend = Backend(store, params.run_id)
    handler = create_handler(store, backend, params)
    if params.max_nodes > 1:  # one node has no order to decide and nobody to disagree with
        handler = _with_launch_settings(handler, store, backend, params)
    torchinternals.fresh_store_per_round(handler)
    if bind_addr:
        # The handler creates the ranks' shared store (on the node of rendezvous rank 0) through this,
        # which otherwise listens on every interface.
        torchinternals.bind_shared_store(
            handler, lambda master_addr, master_port: listening_store(bind_addr, master_port, timeout_s=read_timeout))
    return handler


def _with_launch_settings(torch_handler, store, backend, params: RendezvousParameters):
    """torch's handler (its timeouts and keep-alive parsed from `params`), rebuilt around a `_Node` that
    carries this node's --node-rank and --nnodes, and whose join checks the other nodes against them.
    Where this torch's internals are not the ones ddpkit read, torch's handler as it is (warned)."""
    low, high = params.min_nodes, params.max_nodes
    nnodes = str(low) if low == high else f"{low}:{high}"

    def launched(plain) -> _Node:
        return _Node(plain.addr, plain.pid, plain.local_id, node_rank=params.get_as_int("node_rank"), nnodes=nnodes)

    rebuilt = torchinternals.handler_with_node(torch_handler, launched, backend=backend, store=store)
    if rebuilt is None:
        return torch_handler
    handler, node = rebuilt
    seen: set = set()  # nodes that were participants while this node was joining

    def check(state) -> None:
        # Runs after every sync with the store, before torch decides the next step: a node
        # launched differently fails here, on every node that sees it, instead of timing out.
        seen.update(state.participants)
        _check_peers(node, state)

    if not torchinternals.check_each_join(handler, check):
        return torch_handler
    torch_next_rendezvous = handler.next_rendezvous

    def next_rendezvous():
        seen.clear()
        try:
            return torch_next_rendezvous()
        except (RendezvousTimeoutError, RendezvousClosedError) as e:
            # torch raises these without a message: say what this node saw
            others = sorted(n.describe() for n in seen - {node} if isinstance(n, _Node))
            raise type(e)(f"this node and {len(others)} other(s) joined: " + ", ".join(others) if others
                          else "no other node joined") from None

    handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]
    return handler


def _check_peers(node: _Node, state) -> None:
    """Raise NodeMismatchError when a node of this round was launched with another --nnodes, or two
    participants share a --node-rank. Only once this node is in the state itself, so that the others
    see it too and fail the same way (rather than time out)."""
    if node not in state.participants and node not in state.wait_list:
        return
    by_rank: dict[int, _Node] = {}
    for other in sorted(n for n in state.participants if isinstance(n, _Node)):
        if other.nnodes != node.nnodes:
            raise NodeMismatchError(
                f"this node has --nnodes {node.nnodes} but {other.describe()} joined the same rendezvous; "
                "start every node with the same --nnodes and --rdzv-endpoint")
        if node not in state.participants or other.node_rank is None:
            continue
        if other.node_rank in by_rank:
            high = int(node.nnodes.rpartition(":")[2])
            raise NodeMismatchError(
                f"--node-rank {other.node_rank} was given to two nodes, {by_rank[other.node_rank].describe()} and "
                f"{other.describe()}; give each node its own --node-rank (0..{high - 1}), or none of them")
        by_rank[other.node_rank] = other


def register() -> None:
    """Make `--rdzv-backend=ddpkit-c10d` known to torchrun in this process (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)

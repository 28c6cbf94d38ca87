"""torchrun's c10d rendezvous with its stores listening on one address instead of every interface."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

__all__ = ["BACKEND", "listening_store", "register"]

BACKEND = "ddpkit-c10d"
"""Name of the rendezvous backend `ddpkit run` registers in its own torchrun process.

It is torch's c10d backend plus one setting, `bind_addr` (in --rdzv-conf): the stores this launcher
hosts (the rendezvous store on the host node, the ranks' shared store on rank 0's node) listen on that
address only. torch's own TCPStore server listens on every interface ('*'), so a single-node job
would otherwise be reachable from the network.
"""


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
    handler = create_handler(store, Backend(store, params.run_id), params)
    _fresh_store_per_round(handler)
    if not bind_addr:
        return handler

    # The one hook into torch's internals: the handler creates the ranks' shared store (on the node
    # of rendezvous rank 0) through this method, which otherwise listens on every interface.
    def _bound_store_server(master_addr: str, master_port: int) -> TCPStore:
        return listening_store(bind_addr, master_port, timeout_s=read_timeout)

    handler._create_tcp_store_server = _bound_store_server  # type: ignore[attr-defined]
    return handler


def _fresh_store_per_round(handler: RendezvousHandler) -> None:
    """Give the ranks a new shared store in every rendezvous round, i.e. after every restart.

    torch (2.5 and later) creates the ranks' store once and keeps it across --max-restarts, while the
    process-group keys the ranks write carry no attempt prefix: a restarted rank can read the
    address a killed rank published and fail with "connectFullMesh ... Connection refused"
    (pytorch/pytorch#135712). A new store per round (a new MASTER_PORT) holds no stale keys.
    """
    if not hasattr(handler, "_bootstrap_store_info"):
        return  # a torch whose handler does not cache the store
    torch_next_rendezvous = handler.next_rendezvous

    def next_rendezvous():
        handler._bootstrap_store_info = None  # type: ignore[attr-defined]
        handler._shared_tcp_store_server = None  # type: ignore[attr-defined]
        return torch_next_rendezvous()

    handler.next_rendezvous = next_rendezvous  # type: ignore[method-assign]


def register() -> None:
    """Make `--rdzv-backend=ddpkit-c10d` known to torchrun in this process (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)

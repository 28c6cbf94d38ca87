"""Every private torch name ddpkit uses, each gated to the torch releases it was read against.

ddpkit works around a few gaps and bugs of torch's own pieces (docs/releases.md lists each patch,
the torch bug it answers and whether a current torch still needs it). The private names those
patches need live here and nowhere else. Each function below uses its names only on a torch in
`READ_AGAINST`; on any other release, or where the names have moved, it falls back to torch's
public behaviour and warns in one line what is lost. tests/unit/test_torchinternals.py checks every
name against the installed torch and fails, naming it and the release, when torch changes one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = [
    "READ_AGAINST",
    "TorchInternalsWarning",
    "torch_version",
    "node_desc_base",
    "handler_with_node",
    "check_each_join",
    "fresh_store_per_round",
    "bind_shared_store",
    "default_store",
    "abort_process_group",
    "nccl_flight_record",
    "grad_scaler_scale",
    "step_unless_on_device",
    "compiled_inner",
    "flight_records",
]

READ_AGAINST = SpecifierSet(">=2.11,<2.16")
"""The torch releases every name in this module was read against; 2.11.0, 2.12.1, 2.13.0 (the CI pin),
2.14.1 and 2.15.0 were run (docs/releases.md). Widen it only after reading each name again in the new
release and running tools/torch-next-tests.sh there."""

_NCCL2_FROM = Version("2.15")
"""From torch 2.15 on, "nccl" is ProcessGroupNCCL2 (TORCH_DIST_USE_NCCL2=0 keeps the stock ProcessGroupNCCL,
also named "nccl-legacy"). It has no flight recorder of its own: c10d's FlightRecorderHook records its
collectives in the recorder named after the backend, "nccl2", which only `_dump_fr_trace(backend=...)` reads."""

_DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


class TorchInternalsWarning(UserWarning):
    """A ddpkit patch of torch is off on this torch (another release, or the names moved): torch's own
    behaviour applies, and the message says what that costs."""


def torch_version() -> Version:
    """The installed torch's release, without local or dev parts ('2.14.1+cu130' -> 2.14.1)."""
    import torch

    return Version(Version(torch.__version__).base_version)


def _usable(name: str, lost: str) -> bool:
    """Whether `name` may be used on this torch; if not, warn once in one line what is `lost`."""
    version = torch_version()
    if version in READ_AGAINST:
        return True
    _fall_back(name, f"torch {version} is not one of the releases ddpkit read it against ({READ_AGAINST})", lost)
    return False


def _fall_back(name: str, why: str, lost: str) -> None:
    warnings.warn(f"ddpkit: not using {name} ({why}): {lost}", TorchInternalsWarning, stacklevel=4)


# --- rendezvous: node descriptors ordered by --node-rank, checked against the other nodes' --nnodes ---

_NODE_ORDER_LOST = ("nodes are numbered in torch's order (address, then process id), not by --node-rank, and nodes "
                    "launched with different --nnodes time out instead of failing at once")


@dataclass(eq=True, order=True, frozen=True)
class _PlainNodeDesc:
    """The shape of torch's node descriptor, for a torch whose own is not usable (then no torch code sees it)."""

    addr: str
    pid: int
    local_id: int

    def __repr__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"


def node_desc_base() -> type:
    """`dynamic_rendezvous._NodeDesc`, the frozen dataclass (addr, pid, local_id) torch's handler keys the
    rendezvous state by, as a base class; a same-shaped stand-in where it is not usable (silent: the
    handler functions below then warn and keep torch's handler)."""
    try:
        if torch_version() in READ_AGAINST:
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

            return _NodeDesc
    except ImportError:
        pass
    return _PlainNodeDesc


def handler_with_node(handler, make_node: Callable[[Any], Any], *, backend, store) -> tuple[Any, Any] | None:
    """torch's handler rebuilt around the node descriptor `make_node(torch_node)` returns (an instance
    of a `node_desc_base()` subclass, made from the one torch drew for this launcher, `_this_node`).
    The constructor hands the node to every part that uses it (op executor, heartbeats, store info);
    `handler`'s settings (its timeouts and keep-alive, parsed by torch) are kept. Returns (handler,
    node), or None where not usable.

    Uses `DynamicRendezvousHandler(node, settings, backend_name, store, state_holder)` (the public
    constructor, `from_backend`, draws its own node) and `_BackendRendezvousStateHolder(backend, settings)`.
    """
    name = f"{_DYNAMIC}.DynamicRendezvousHandler(node, ...), ._this_node and _BackendRendezvousStateHolder"
    if not _usable(name, _NODE_ORDER_LOST):
        return None
    if node_desc_base() is _PlainNodeDesc:
        _fall_back(name, f"{_DYNAMIC}._NodeDesc is missing", _NODE_ORDER_LOST)
        return None
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler, _BackendRendezvousStateHolder,
        )

        node = make_node(handler._this_node)
        settings = handler.settings
        rebuilt = DynamicRendezvousHandler(node, settings, backend.name, store,
                                           _BackendRendezvousStateHolder(backend, settings))
    except (ImportError, AttributeError, TypeError) as e:
        _fall_back(name, f"it differs from the one ddpkit read: {e}", _NODE_ORDER_LOST)
        return None
    return rebuilt, node


def check_each_join(handler, check: Callable[[Any], None]) -> bool:
    """Call `check(state)` with the rendezvous state after every sync with the store while this node
    joins, before torch decides its next step (so `check` can raise and end the join). False where not
    usable. Wraps the handler's `_op_executor.run` for torch's `_RendezvousJoinOp` only."""
    name = f"{_DYNAMIC}._RendezvousJoinOp and the handler's _op_executor.run"
    if not _usable(name, _NODE_ORDER_LOST):
        return False
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousJoinOp

        executor = handler._op_executor
        torch_run = executor.run
    except (ImportError, AttributeError) as e:
        _fall_back(name, f"it differs from the one ddpkit read: {e}", _NODE_ORDER_LOST)
        return False

    def run(state_handler, deadline, update_deadline=None):
        if not isinstance(state_handler, _RendezvousJoinOp):
            return torch_run(state_handler, deadline, update_deadline)

        def checked(ctx, op_deadline):
            check(ctx.state)
            return state_handler(ctx, op_deadline)

        return torch_run(checked, deadline, update_deadline)

    executor.run = run
    return True


# --- rendezvous: a new store for the ranks in every round (pytorch/pytorch#135712) ---

def fresh_store_per_round(handler) -> bool:
    """Make torch's handler create the ranks' shared store anew in every rendezvous round, i.e. after
    every restart. False where not usable.

    torch (2.5 and later) creates that store once and keeps it across --max-restarts, while the
    process-group keys the ranks write carry no attempt prefix: a restarted rank can read the address
    a killed rank published and fail with "connectFullMesh ... Connection refused"
    (pytorch/pytorch#135712). `next_rendezvous` builds the store when `_bootstrap_store_info` is None
    (and, on rank 0, `_shared_tcp_store_server`): clearing both before each round gives a new store
    (a new MASTER_PORT) that holds no stale keys.
    """
    name = f"{_DYNAMIC}.DynamicRendezvousHandler._bootstrap_store_info and ._shared_tcp_store_server"
    lost = ("after a restart (--max-restarts) the ranks reuse the previous round's store and can fail to "
            "connect (pytorch/pytorch#135712)")
    if not _usable(name, lost):
        return False
    if not (hasattr(handler, "_bootstrap_store_info") and hasattr(handler, "_shared_tcp_store_server")):
        _fall_back(name, "the handler has no such attributes", lost)
        return False
    torch_next_rendezvous = handler.next_rendezvous

    def next_rendezvous():
        handler._bootstrap_store_info = None
        handler._shared_tcp_store_server = None
        return torch_next_rendezvous()

    handler.next_rendezvous = next_rendezvous
    return True


# --- rendezvous: the ranks' shared store listens on one address ---

def bind_shared_store(handler, create: Callable[[str, int], Any]) -> bool:
    """Have torch's handler create the ranks' shared store (on the node of rendezvous rank 0) with
    `create(master_addr, master_port)` instead of its `_create_tcp_store_server`, whose TCPStore listens
    on every interface. False where not usable."""
    name = f"{_DYNAMIC}.DynamicRendezvousHandler._create_tcp_store_server"
    lost = "the ranks' shared store listens on every interface of rank 0's node, not only on the one asked for"
    if not _usable(name, lost):
        return False
    if not callable(getattr(handler, "_create_tcp_store_server", None)):
        _fall_back(name, "the handler has no such method", lost)
        return False
    handler._create_tcp_store_server = create
    return True


# --- runtime: the store of the default process group ---

def default_store():
    """The store of the default process group (`distributed_c10d._get_default_store`), or None where not
    usable or no group exists. torch has no public accessor for it."""
    name = "torch.distributed.distributed_c10d._get_default_store"
    if not _usable(name, "ddpkit.close() waits for the other ranks with a gloo barrier only"):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store
    except ImportError as e:
        _fall_back(name, str(e), "ddpkit.close() waits for the other ranks with a gloo barrier only")
        return None
    try:
        return _get_default_store()
    except (RuntimeError, ValueError):  # no default group
        return None


# --- runtime: abort the process group on the error path ---

def abort_process_group() -> bool:
    """Abort every process group without waiting for in-flight collectives; False where not usable.

    `destroy_process_group()` shuts backends down gracefully, which since torch 2.6 waits for the
    NCCL work in flight: on an error path, with a peer dead or stuck, that never returns. torch has
    no public abort, only `distributed_c10d._abort_process_group` (ncclCommAbort under NCCL).
    """
    name = "torch.distributed.distributed_c10d._abort_process_group"
    lost = "an error path destroys the process group, which waits for NCCL work in flight"
    if not _usable(name, lost):
        return False
    import torch.distributed.distributed_c10d as c10d

    abort = getattr(c10d, "_abort_process_group", None)
    if abort is None:
        _fall_back(name, "it is missing", lost)
        return False
    abort()
    return True


# --- watchdog: the NCCL flight recorder's buffer ---

def _nccl_dumps(c10d: Any) -> list[Callable[..., bytes]]:
    """The dump functions of this process's NCCL flight recorders, newest engine first: on torch >= 2.15
    nccl2's (`_dump_fr_trace(backend="nccl2")`), then the stock ProcessGroupNCCL's (`_dump_nccl_trace`)."""
    dumps = []
    fr_dump = getattr(c10d, "_dump_fr_trace", None)
    if fr_dump is not None and torch_version() >= _NCCL2_FROM:
        dumps.append(lambda **kw: fr_dump(backend="nccl2", **kw))
    nccl_dump = getattr(c10d, "_dump_nccl_trace", None)
    if nccl_dump is not None:
        dumps.append(nccl_dump)
    return dumps


def _read_dump(dump: Callable[..., bytes], only_active: bool) -> dict[str, Any] | None:
    import pickle

    try:
        data = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=only_active))
    except RuntimeError:  # no such process group yet, or the recorder is disabled
        return None
    return data if isinstance(data, dict) else None


def nccl_flight_record(*, only_active: bool = False) -> dict[str, Any] | None:
    """This process's NCCL flight-recorder buffer (torch's dict with 'entries'), or None without one.

    None on builds without NCCL, where not usable, or when the recorder is off
    (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE 0). Reads
    `torch._C._distributed_c10d._dump_nccl_trace`, the function torch's own dump on timeout uses, and
    on torch >= 2.15 first `_dump_fr_trace(backend="nccl2")`, where 2.15's default "nccl" records;
    the first buffer with entries is returned.
    """
    if not _usable("torch._C._distributed_c10d._dump_nccl_trace", "hang reports leave out NCCL's flight recorder"):
        return None
    import torch

    c10d = getattr(torch._C, "_distributed_c10d", None)
    if getattr(c10d, "_dump_nccl_trace", None) is None:
        return None  # a build without NCCL: nothing to fold in, nothing lost
    found = None
    for dump in _nccl_dumps(c10d):
        data = _read_dump(dump, only_active)
        if data is not None and data.get("entries"):
            return data
        found = data if found is None else found
    return found


def flight_records() -> list[dict[str, Any]]:
    """Every flight-recorder buffer of this process with its unfinished entries only: NCCL's
    (`_dump_nccl_trace`, and on torch >= 2.15 nccl2's, `_dump_fr_trace(backend="nccl2")`) and the one
    of other backends such as gloo (`_dump_fr_trace`), as torch's dicts with 'entries'; empty without
    a recorder (TORCH_FR_BUFFER_SIZE 0) or where not usable.
    """
    if not _usable("torch._C._distributed_c10d._dump_fr_trace",
                   "hang reports cannot see collectives issued from C++ (DDP's gradient all-reduces, FSDP's)"):
        return []
    import torch

    c10d = getattr(torch._C, "_distributed_c10d", None)
    dumps = _nccl_dumps(c10d)
    if getattr(c10d, "_dump_fr_trace", None) is not None:
        dumps.append(c10d._dump_fr_trace)  # gloo's, torch's default
    return [data for data in (_read_dump(dump, True) for dump in dumps) if data is not None]


# --- precision: GradScaler's scale and fused optimizers' on-device skip ---

def grad_scaler_scale(scaler: Any) -> Any:
    """The loss scale of a `torch.amp.GradScaler` as a tensor on its device (no host sync), or None
    before the first `scale()`/`unscale_()`.

    `GradScaler.get_scale()` returns a Python float, i.e. a device sync every call; the tensor lives
    in the private `_scale`. Where that is not usable, the float is read (a sync) and returned as a
    CPU tensor, so callers stay correct.
    """
    name = "torch.amp.GradScaler._scale"
    if _usable(name, "Precision.step reads the loss scale on the host every step (a device sync)") \
            and hasattr(scaler, "_scale"):
        return scaler._scale
    import torch

    return torch.tensor(scaler.get_scale())


def step_unless_on_device(optimizer: Any, skip: Any) -> bool:
    """`optimizer.step()` skipped on the device where `skip` (a 0-dim tensor) is true; False if it cannot.

    torch's fused optimizers (`fused=True` Adam, AdamW, SGD, ...) mark themselves with the private
    `_step_supports_amp_scaling` and read a `found_inf` tensor that makes their kernel leave the
    parameters and step counts alone - the way GradScaler skips a step without reading a flag on
    the host. Other optimizers, and torch releases this was not read against, return False: the
    caller then decides on the host.
    """
    if torch_version() not in READ_AGAINST or not getattr(optimizer, "_step_supports_amp_scaling", False):
        return False
    import torch

    optimizer.grad_scale = None
    optimizer.found_inf = skip.to(torch.float32)
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale
        del optimizer.found_inf
    return True


# --- parallel, fsdp: the module inside a torch.compile wrapper ---

def compiled_inner(model: Any) -> Any:
    """The module a `torch.compile` wrapper (`OptimizedModule`) holds, or None for any other object.

    torch keeps it in the private `_orig_mod` and has no public accessor; ddpkit needs it to find
    DDP or FSDP under a compiled model and to save the user's module without `_orig_mod.` key
    prefixes. On a torch this was not read against the attribute is still read (there is no other
    way to reach the module), after a one-line warning.
    """
    if type(model).__name__ != "OptimizedModule" and not hasattr(model, "_orig_mod"):
        return None
    if torch_version() not in READ_AGAINST:
        _fall_back("torch.compile's OptimizedModule._orig_mod",
                   f"torch {torch_version()} is not one of the releases ddpkit read it against ({READ_AGAINST})",
                   "ddpkit reads it anyway to unwrap compiled models; check unwrap() on this release")
    return getattr(model, "_orig_mod", None)

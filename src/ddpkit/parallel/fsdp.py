"""Shard a model over the ranks with FSDP2's `fully_shard`: units, mixed precision, full-parameter views.

    model = ddpkit.wrap(build_model(), ctx, strategy="fsdp")

`ddpkit.wrap(strategy="fsdp")` calls `shard` here. Each sharding unit's parameters, gradients and
(through the optimizer, which sees the sharded parameters) optimizer state live 1/W per rank as
DTensor shards; a unit's parameters are all-gathered before its forward and its gradients
reduce-scattered after its backward. At world size 1 nothing is sharded (there is no process
group; wrap returns the module), so one script runs everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["MIN_UNIT_PARAMS", "MIN_TORCH", "shard", "shard_units", "no_gradient_sync", "mixed_precision_policy",
           "refuse_fp16", "on_meta", "materialize"]

MIN_UNIT_PARAMS = 100_000
"""A block becomes its own sharding unit when it holds at least this many parameters (400 KB in fp32):
smaller all-gathers cost their latency, not their bytes, so they stay in their parent's unit."""

MIN_TORCH = "2.6"
"""First torch release with the public `torch.distributed.fsdp.fully_shard` (FSDP2)."""



def _owners(model: torch.nn.Module) -> dict[int, set[str]]:
    """id(parameter) -> the names of every module that registers it (more than one for tied weights)."""
    owners: dict[int, set[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(name)
    return owners


def _inside(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _shared_outside(prefix: str, module: torch.nn.Module, owners: dict[int, set[str]]) -> str | None:
    """A module outside `prefix` that shares one of `module`'s parameters (tied weights), if any."""
    for p in module.parameters():
        for owner in owners.get(id(p), ()):
            if not _inside(owner, prefix):
                return owner or "the root module"
    return None


def shard_units(model: torch.nn.Module, shard_modules: tuple[type, ...] | None = None, *,
                min_params: int = MIN_UNIT_PARAMS) -> list[tuple[str, torch.nn.Module]]:
    """The submodules that become sharding units of their own, innermost first; the root comes after them.

    Default (`shard_modules=None`): the blocks, i.e. each child of an `nn.ModuleList` or
    `nn.Sequential` holding at least `min_params` parameters (outermost such containers; a
    transformer's layers, an MLP's big Linear layers). Explicit: every submodule that is an
    instance of one of the `shard_modules` classes. A unit that shares a parameter with a module
    outside it (an embedding tied to the output layer) is left to an enclosing unit by default and
    refused when named explicitly: FSDP shards a parameter in one unit only.
    """
    import torch

    owners = _owners(model)
    named = list(model.named_modules())
    if shard_modules is not None:
        for cls in shard_modules:
            if not any(isinstance(m, cls) for _, m in named):
                blocks = sorted({type(m).__name__ for _, c in named
                                 if isinstance(c, (torch.nn.ModuleList, torch.nn.Sequential)) for m in c.children()})
                hint = f" (its blocks are {', '.join(blocks)})" if blocks else ""
                raise ValueError(f"wrap(shard_modules=({cls.__name__},)): the model has no {cls.__name__} "
                                 f"submodule{hint}; name classes of the model's own submodules, or leave "
                                 "shard_modules out for the default units")
        chosen = [(n, m) for n, m in named if n and isinstance(m, shard_modules)]
        for name, module in chosen:
            other = _shared_outside(name, module, owners)
            if other is not None:
                raise ValueError(f"wrap(shard_modules=...): {name} ({type(module).__name__}) shares a parameter "
                                 f"with {other} outside it (tied weights), and FSDP shards a parameter in one unit "
                                 f"only; leave {type(module).__name__} out of shard_modules")
        return list(reversed(chosen))
    chosen: list[tuple[str, torch.nn.Module]] = []
    for name, module in named:
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        if any(_inside(name, unit) for unit, _ in chosen):  # outermost blocks only
            continue
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if sum(p.numel() for p in child.parameters()) >= min_params and \
                    _shared_outside(full, child, owners) is None:
                chosen.append((full, child))
    return list(reversed(chosen))


def refuse_fp16(where: str) -> None:
    """The one refusal of fp16 with FSDP (wrap's precision= and Precision.step both raise it).

    fp16 needs a loss scaler, and the scaler checks gradients for inf/nan per rank: with sharded
    gradients each rank sees only its shard, so ranks would disagree on skipping a step.
    """
    raise ValueError(f"{where}: the fp16 loss scaler checks gradients for inf/nan per rank, and with FSDP's sharded "
                     "gradients ranks would disagree on skipping a step; use ddpkit.Precision(ctx, 'bf16')")


def mixed_precision_policy(precision: Any):
    """FSDP2's MixedPrecisionPolicy for a `ddpkit.Precision` (or its dtype name); None for fp32 or no precision.

    bf16: parameters all-gathered and computed in bf16, gradients reduce-scattered in fp32, shards
    and optimizer state kept in fp32. fp16 is refused (its loss scaler would find inf/nan per shard).
    """
    import torch

    if precision is None:
        return None
    dtype = precision if isinstance(precision, str) else getattr(precision, "dtype", None)
    if dtype == "fp16":
        refuse_fp16("wrap(strategy='fsdp', precision=fp16)")
    if dtype not in ("bf16", "fp32"):
        raise TypeError(f"wrap(precision={precision!r}) must be a ddpkit.Precision, 'bf16', 'fp32' or None")
    if dtype == "fp32":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard(model: torch.nn.Module, ctx: Context, *, shard_modules: tuple[type, ...] | None = None,
          reshard_after_forward: bool = True, precision: Any = None) -> torch.nn.Module:
    """Apply `fully_shard` to `model`'s units, then its root, in place; return it. Collective.

    Every rank must call it with the same model structure. Rank 0's parameters and buffers are
    broadcast first (as DDP does at wrap time), so every rank's shard comes from one model; a model
    on the meta device is sharded as it is (see `materialize`).
    `reshard_after_forward=True` frees each unit's gathered parameters after its forward and
    gathers them again in backward (ZeRO-3: least memory); False keeps them until backward
    (ZeRO-2-like: one all-gather per step less, the full parameters held between forward and
    backward). The root unit keeps its parameters for backward either way (FSDP's own choice).
    """
    import torch
    from packaging.version import Version

    if Version(torch.__version__.split("+")[0]) < Version(MIN_TORCH):
        raise RuntimeError(f"wrap(strategy='fsdp') needs torch >= {MIN_TORCH} (fully_shard), found "
                           f"{torch.__version__}; upgrade torch or use strategy='ddp'")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    units = shard_units(model, shard_modules)
    policy = mixed_precision_policy(precision)
    extra = {} if policy is None else {"mp_policy": policy}
    # fully_shard keeps each rank's own values; ranks seeded differently would build one model out
    # of W different initialisations. Every rank must start from rank 0's, as with DDP. (A model on
    # the meta device has no values yet: each rank initialises its own shards after sharding.)
    seen: set[int] = set()
    if on_meta(model):
        seen = {id(t) for t in [*model.parameters(), *model.buffers()]}
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                dist.broadcast(t.data, src=0)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for _, unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, **extra)
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard_after_forward else False, **extra)
    return model


@contextlib.contextmanager
def no_gradient_sync(module) -> Iterator[None]:
    """Backward inside accumulates unsharded gradients locally instead of reduce-scattering them."""
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def on_meta(model: torch.nn.Module) -> bool:
    """True when any parameter or buffer of `model` is on the meta device (built without memory)."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def materialize(model: torch.nn.Module, device: torch.device, init_weights: Any = None, *,
                distributed: bool = False) -> None:
    """Give a meta-device model memory on `device` and initialise it, in place; after `shard` that is
    each rank's own shards only (1/W of the parameters), never the whole model.

    `init_weights(model)`, when given, initialises everything (under `torch.no_grad()`). Without it,
    every submodule that holds parameters or buffers of its own must have `reset_parameters()`
    (torch's layers do), which is called; a module without one is refused, since its memory would
    stay uninitialised. With `distributed=True` (a collective: all ranks must call it), buffers are
    then broadcast from rank 0, so replicated state is the same on every rank.
    """
    import torch

    if init_weights is None:
        for name, module in model.named_modules():
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            if own and not callable(getattr(module, "reset_parameters", None)):
                raise ValueError(f"wrap(): the model is on the meta device and {name or 'the root module'} "
                                 f"({type(module).__name__}) holds parameters or buffers but has no "
                                 "reset_parameters(), so its memory would stay uninitialised; pass init_weights=fn, "
                                 "where fn(model) initialises every parameter and buffer")
    model.to_empty(device=device)
    with torch.no_grad():
        if init_weights is not None:
            init_weights(model)
        else:
            for module in model.modules():
                if [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    module.reset_parameters()
        if distributed:
            import torch.distributed as dist

            from ddpkit.parallel.strategy import is_dtensor

            for b in model.buffers():
                if not is_dtensor(b):
                    dist.broadcast(b, src=0)

"""Shard the optimizer step over CPU ranks on one host: parameters in shared memory, each rank updates 1/W.

    model = ddpkit.wrap(build_model(), ctx)
    opt = ddpkit.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=3e-4), model, ctx)

Without it every rank runs the same optimizer step on its own copy of every parameter: W times
the work and W copies of the optimizer state, all of it redundant, since DDP gives every rank the
same averaged gradients. Sharded, the parameters live once in a shared segment that every rank's
model reads, each rank steps one contiguous 1/W of them (its "pieces", cut at any element) and
keeps the optimizer state for those only, and two barriers per step keep the reads and the writes
apart. The result is the unsharded step's, bit for bit (fused=True kernels: within float rounding,
as their vectorised body and scalar tail round differently and sharding moves where a piece starts).

Where it does not apply (one process, CUDA, ranks on several hosts) `shard_optimizer` checks its
arguments and returns the optimizer unchanged, so one script runs everywhere.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ddpkit.shardstate import FIX, WHAT, Shard, options

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["shard_optimizer", "SHARDABLE", "is_sharded", "optimizer_parameters"]

SHARDABLE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta", "ASGD", "Rprop")
"""torch.optim classes shard_optimizer accepts: their update of an element depends on that element only."""

_ALIGN = 64


def shard_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, ctx: Context) -> torch.optim.Optimizer:
    """Return an optimizer that steps only this rank's 1/W of `optimizer`'s parameters. Collective.

    Call it on every rank, after `ddpkit.wrap` and before the first step, a learning-rate
    scheduler or loading a state; use the returned optimizer from then on (the one passed in
    refuses to step). It is an instance of the same class, so schedulers and `isinstance` work.

    - `step()` is a collective: every rank must call it the same number of times. It waits for
      every rank's backward, updates this rank's pieces, and waits for every rank's update.
    - `zero_grad()` clears the gradients of all the parameters, as the unsharded one would.
    - `state_dict()` works on any one rank alone (save_checkpoint calls it on rank 0) and is the
      unsharded optimizer's, so checkpoints load into sharded and unsharded runs alike;
      `load_state_dict()` must run on every rank (load_checkpoint does).
    - `param_groups` hold this rank's pieces: clip gradients with `model.parameters()` (or
      ddpkit.Precision.step, which does), not with the optimizer's groups.

    Returned unchanged (after the checks) at world size 1, on CUDA or with ranks on several hosts.
    Not for fp16 loss scaling (bf16 is fine), closures, sparse gradients or parameters added later.
    """
    import torch

    from ddpkit.shm import shm_unsupported
    from ddpkit.parallel import find_ddp

    cls = type(optimizer)
    if isinstance(optimizer, _Sharded):
        raise ValueError("shard_optimizer() got an optimizer it already sharded; pass the original once")
    allowed = {getattr(torch.optim, n) for n in SHARDABLE if hasattr(torch.optim, n)}
    if cls not in allowed:
        raise TypeError(f"shard_optimizer() supports torch.optim's {', '.join(SHARDABLE)}, whose update of a "
                        f"parameter element depends on that element alone; got {cls.__module__}.{cls.__qualname__}: "
                        "step it unsharded")
    if optimizer.state:
        raise ValueError("shard_optimizer() needs an optimizer that has not stepped or loaded a state yet; shard it "
                         "right after creating it and load saved state into the returned one (load_checkpoint does)")
    if "step" in vars(optimizer):  # a learning-rate scheduler wraps the instance's step() to count calls
        raise ValueError("shard_optimizer() got an optimizer that a learning-rate scheduler already holds (the "
                         "scheduler would keep setting the old optimizer's learning rate); create the scheduler from "
                         "the optimizer shard_optimizer() returns")
    ddp = find_ddp(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if ctx.distributed and ddp is None:
        raise TypeError(f"shard_optimizer(optimizer, model, ctx) needs the model ddpkit.wrap returned, got "
                        f"{type(model).__name__}")
    owned = {id(p) for p in (ddp.module if ddp is not None else model).parameters()}
    for i, p in enumerate(params):
        if id(p) not in owned:
            raise ValueError(f"shard_optimizer(): the optimizer's parameter {i} {tuple(p.shape)} is not a parameter of "
                             "the model; shard an optimizer over the wrapped model's parameters only")
        if p.is_complex() or not p.is_floating_point():
            raise TypeError(f"shard_optimizer(): parameter {i} has dtype {p.dtype}; only real floating-point "
                            "parameters can be sharded")
    if any(getattr(m, "sparse", False) is True for m in model.modules()):
        raise ValueError("shard_optimizer() cannot shard sparse gradients (a module has sparse=True); step this "
                         "optimizer unsharded")
    if not ctx.distributed or shm_unsupported(ctx):
        return optimizer
    if not params:
        raise ValueError("shard_optimizer() got an optimizer without parameters")
    return _shard(optimizer, params, ctx)


def is_sharded(optimizer: Any) -> bool:
    """Whether `optimizer` came from shard_optimizer (its param_groups hold this rank's pieces)."""
    return getattr(optimizer, "_ddpkit_shard", None) is not None


def optimizer_parameters(optimizer: Any) -> list:
    """The parameters `optimizer` trains: the whole model's for a sharded one, not this rank's pieces."""
    if is_sharded(optimizer):
        return list(optimizer._ddpkit_shard.params)
    return [p for group in optimizer.param_groups for p in group["params"]]


class _Sharded:
    """Mixed into the user's optimizer class (see `_sharded_class`); the sharding lives in `_ddpkit_shard`."""

    _ddpkit_shard: Shard

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient (not only this rank's pieces), as the unsharded optimizer would."""
        for p in self._ddpkit_shard.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
        for piece in self._ddpkit_shard.pieces:
            piece.grad = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_ddpkit_shard", None) is not None:
            raise ValueError("a sharded optimizer cannot take new parameters: add the group before shard_optimizer()")
        super().add_param_group(param_group)  # type: ignore[misc]

    def state_dict(self) -> dict[str, Any]:
        """The unsharded optimizer's state dict, read from the shared segment: any one rank may call it."""
        for hook in self._optimizer_state_dict_pre_hooks.values():  # type: ignore[attr-defined]
            hook(self)
        out = self._ddpkit_shard.full_state_dict(self.param_groups)  # type: ignore[attr-defined]
        for hook in self._optimizer_state_dict_post_hooks.values():  # type: ignore[attr-defined]
            out = hook(self, out) or out
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load an (unsharded) state dict: this rank keeps its pieces' share. Collective: every rank calls it."""
        shard = self._ddpkit_shard
        super().load_state_dict(shard.piece_state_dict(state_dict))  # type: ignore[misc]
        shard.publish(self.state, everything=True)  # type: ignore[attr-defined]
        shard.barrier("load_state_dict")  # every rank's share is in place before any rank reads the state


@functools.lru_cache(maxsize=None)
def _sharded_class(cls: type) -> type:
    """ShardedAdamW for AdamW, and so on: one class per optimizer class."""
    return type(f"Sharded{cls.__name__}", (_Sharded, cls), {"__module__": __name__})


def _rebuilt(optimizer, cls: type, groups: list[dict[str, Any]]):
    """A fresh optimizer of class `cls` with `optimizer`'s settings and hooks over `groups`.

    Built from the instance rather than by calling the class again: that needs no knowledge of
    each class's constructor arguments, and keeps what its __init__ set (e.g. fused flags).
    """
    from collections import OrderedDict, defaultdict

    new = object.__new__(cls)
    new.__dict__.update(optimizer.__dict__)
    for name, value in optimizer.__dict__.items():
        if isinstance(value, OrderedDict):  # the hook registries: the new optimizer gets its own copies
            new.__dict__[name] = OrderedDict(value)
    new.state = defaultdict(dict)
    new.param_groups = []
    new._ddpkit_shard = None
    for group in groups:
        new.add_param_group(group)
    return new


def _state_keys(optimizer, cls: type, group: dict[str, Any], dtype) -> tuple[list[str], dict[str, Any]]:
    """What state `group`'s settings make this optimizer keep per parameter: (per-element keys,
    {per-parameter scalar key: dtype}), found by one step of a copy of it on a dummy parameter."""
    import torch

    dummy = torch.zeros(3, dtype=dtype, requires_grad=True)
    probe = _rebuilt(optimizer, cls, [{**options(group), "params": [dummy]}])
    for name, value in list(probe.__dict__.items()):  # no user hooks on the dummy step
        if name.startswith("_optimizer_step_") and isinstance(value, dict):
            value.clear()
    dummy.grad = torch.ones_like(dummy)
    probe.step()
    elementwise, scalars = [], {}
    for key, value in probe.state[dummy].items():
        if isinstance(value, torch.Tensor) and value.shape == dummy.shape and value.dtype == dtype:
            elementwise.append(key)
        elif isinstance(value, torch.Tensor) and value.dim() == 0 and value.element_size() <= 8:
            scalars[key] = value.dtype
        else:
            raise TypeError(f"shard_optimizer(): {cls.__name__} keeps state {key!r} as {type(value).__name__} "
                            f"{getattr(value, 'shape', '')}, which cannot be shared; step this optimizer unsharded")
    return elementwise, scalars


def _shard(optimizer, params: list, ctx: Context):
    import torch

    from ddpkit.shm import ShmBarrier, map_segment

    cls = type(optimizer)
    rank, world = ctx.rank, ctx.world_size
    # Per group: its parameters' indices and the state its settings keep.
    group_params, group_keys, index = [], [], 0
    for group in optimizer.param_groups:
        n = len(group["params"])
        group_params.append(list(range(index, index + n)))
        index += n
        dtype = group["params"][0].dtype if n else torch.float32
        group_keys.append(_state_keys(optimizer, cls, group, dtype))

    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
    arena = map_segment(total, required=True, what=WHAT, fix=FIX)[1]
    base = arena.numel() - total  # after the barrier's header lines
    views = [arena[base + o:base + o + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
             for p, o in zip(params, offsets)]
    if rank == 0:
        for v, p in zip(views, params):
            v.copy_(p.detach())
    barrier = ShmBarrier(arena, rank, world, ctx.timeout_s, "in shard_optimizer() for rank {peer}",
                         "did not call it (every rank must)")
    barrier.wait()
    with torch.no_grad():
        for p, v in zip(params, views):
            p.data = v  # the model now reads the one shared copy
    shard = Shard(params, views, offsets, total, group_params, group_keys, rank, world, barrier)
    groups = [{**options(g), "params": [shard.pieces[j] for j in pieces]}
              for g, pieces in zip(optimizer.param_groups, shard.group_pieces)]
    new = _rebuilt(optimizer, _sharded_class(cls), groups)
    new._ddpkit_shard = shard
    new.register_step_pre_hook(shard.before_step)
    new.register_step_post_hook(shard.after_step)

    def replaced(opt, args, kwargs):
        raise RuntimeError("this optimizer was replaced by ddpkit.shard_optimizer(); step the optimizer it returned")

    optimizer.register_step_pre_hook(replaced)
    return new

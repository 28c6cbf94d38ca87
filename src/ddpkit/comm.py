"""Gradient communication for a DDP model: host shared memory or exact float32 all-reduce, or 16-bit.

`wrap()`'s default, comm="auto", picks "shm" where it can (CPU ranks that all share one host)
and PyTorch's own all-reduce elsewhere. Both give the float32 average of the ranks' gradients;
on 2 ranks they agree bit for bit. "fp16"/"bf16" round gradients to 16 bits (opt-in).
The shared segment and its barrier come from ddpkit.shm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpkit.shm import HEADER_LINE, ShmBarrier, map_segment, shm_unsupported
from ddpkit.tracer import traced

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["COMM_CHOICES", "check_comm", "resolve_comm", "register_comm"]

COMM_CHOICES = ("auto", None, "fp16", "bf16", "shm")
"""Values of `ddpkit.wrap(..., comm=...)`; "auto" (the default) is "shm" where it works, else None."""

_PIECE_BYTES = 1 << 19
"""Gradients cross the segment in pieces of at most this many bytes: its size does not grow with the model."""


def check_comm(comm: Any, ctx: Context | None = None) -> str | None:
    """Validate a `comm=` value (and, for 'shm', that `ctx` is CPU ranks on one host); returns it."""
    if comm not in COMM_CHOICES:
        raise ValueError(
            f"wrap(comm={comm!r}) is not a gradient communication option; use 'auto' (the default), None "
            "(PyTorch's all-reduce), 'fp16' or 'bf16' (half the all-reduce bytes, gradients rounded to 16 bits), "
            "or 'shm' (CPU ranks on one host: sum through shared memory)"
        )
    if comm == "shm" and ctx is not None and ctx.distributed:
        reason = shm_unsupported(ctx)
        if reason:
            raise ValueError(f"wrap(comm='shm') {reason}; use comm=None (exact DDP) or comm='bf16'")
    return comm


def resolve_comm(comm: str | None, ctx: Context, model: torch.nn.Module) -> str | None:
    """The option `comm` stands for on these ranks: "auto" becomes "shm" or None (same on every rank)."""
    if comm != "auto":
        return comm
    if not ctx.distributed or shm_unsupported(ctx):
        return None
    if any(getattr(m, "sparse", False) is True for m in model.modules()):  # sparse gradients: all-reduce them
        return None
    return "shm"


def register_comm(model: torch.nn.Module, comm: str | None, *, explicit: bool = True,
                  timeout_s: float = 600.0) -> None:
    """Install the communication hook for `comm` on a DistributedDataParallel model (None: nothing).

    `explicit=False` means ddpkit picked `comm` ("auto"): a hook the user registers later replaces
    it, and if the shared segment cannot be set up the model keeps PyTorch's all-reduce. A `comm`
    the user chose explicitly owns DDP's one hook slot; registering another one then raises.
    `timeout_s`: how long the shm exchange waits for a peer before raising (init's timeout_s).
    """
    import torch

    if comm is None:
        return
    if comm == "shm":
        state = _shm_state(timeout_s, required=explicit)
        if state is None:
            return
        model.register_comm_hook(state, _shm_hook)
    else:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[comm]
        # torch's own bf16_compress_hook refuses gloo; gloo all-reduces bf16 fine, so ddpkit has its own.
        model.register_comm_hook(None, _compress_hook(dtype))
        state = None
    _guard_hook_slot(model, comm, None if explicit else state)


def _guard_hook_slot(model, comm: str, replaceable: _ShmState | None) -> None:
    """Make the model's register_comm_hook replace ddpkit's automatic exchange (`replaceable`), or
    refuse with a clear message when the user chose `comm` explicitly (`replaceable` is None)."""
    ddp_register = model.register_comm_hook

    def register_comm_hook(hook_state, hook):
        if replaceable is None:
            raise RuntimeError(
                f"this model was wrapped with ddpkit.wrap(comm={comm!r}), which already uses DDP's one "
                "communication-hook slot; wrap it with comm=None to register your own hook")
        model._check_comm_hook(hook)
        replaceable.replace(hook_state, hook)

    def register_builtin_comm_hook(comm_hook_type):
        import torch.distributed as dist

        if replaceable is None or comm_hook_type != dist.BuiltinCommHookType.ALLREDUCE:
            wrapped = repr(comm) if replaceable is None else "'auto'"
            raise RuntimeError(
                f"register_builtin_comm_hook({comm_hook_type}) needs DDP's one communication-hook slot, which "
                f"ddpkit.wrap(comm={wrapped}) already uses; wrap with comm=None "
                "(or comm='fp16' for FP16_COMPRESS)")
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        replaceable.replace(None, allreduce_hook)

    register_comm_hook.__doc__ = ddp_register.__doc__
    model.register_comm_hook = register_comm_hook
    model.register_builtin_comm_hook = register_builtin_comm_hook


def _compress_hook(dtype: torch.dtype):
    """A comm hook: bucket -> 16-bit average over ranks -> back into the float32 bucket.

    It divides by the world size before rounding to 16 bits (an average cannot overflow where a
    sum might). DDP inspects a hook's signature and rejects annotations other than its own, so the
    hook itself is left unannotated.
    """
    import torch.distributed as dist

    def hook(state, bucket):
        group = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(f):
            buffer.copy_(f.value()[0])
            return buffer

        return fut.then(decompress)

    hook.__name__ = f"ddpkit_{str(dtype).rsplit('.', 1)[-1]}_compress_hook"
    return hook


class _ShmState:
    """The shm hook's state: a mapped segment of world_size + 1 piece-sized slots and a flag line per rank.

    Layout: `world_size` header lines (rank r's barrier counter at byte 64r, its pid at 64r + 8),
    then one slot per rank (its contribution: a piece of its bucket, divided by the world size),
    then the result slot (each rank writes the sum of its share of the piece there). The mapping
    belongs to `arena`'s storage and is unmapped when the DDP model, which holds this state, is
    freed; the segment's name is unlinked at setup, so nothing is ever left in /dev/shm.
    """

    def __init__(self, name: str, arena: torch.Tensor, rank: int, world_size: int, timeout_s: float) -> None:
        self.name = name
        self.arena = arena
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.user: tuple[Any, Any] | None = None
        """(state, hook) the user registered in place of this exchange."""
        header = world_size * HEADER_LINE
        self.piece_bytes = (arena.numel() - header) // (world_size + 1)
        self._slot_offsets = [header + s * self.piece_bytes for s in range(world_size + 1)]
        self._plans: dict[tuple, list[tuple]] = {}
        self.barrier = ShmBarrier(arena, rank, world_size, timeout_s, "in backward() for rank {peer}'s gradients",
                                  "skipped a backward() (every rank must run the same number of backward passes "
                                  "through the DDP model)").wait

    def replace(self, state: Any, hook: Any) -> None:
        """Route every bucket to the user's hook from now on and let go of the segment."""
        self.user = (state, hook)
        self._plans.clear()
        self.arena = None

    def plan(self, buffer: torch.Tensor) -> list[tuple]:
        """Per piece of `buffer`: (its start and stop in the flat buffer, its slot, the slots' views of
        this rank's share, the share's place in the result slot, the result for the piece).

        Cached by size and dtype, and made of views of the segment only: a view of the bucket itself
        would keep DDP's first-step buckets (a gradient-sized buffer) alive after DDP rebuilds them.
        """
        key = (buffer.numel(), buffer.dtype)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        views = [self.arena[o:o + self.piece_bytes].view(buffer.dtype) for o in self._slot_offsets]
        slots, result = views[:-1], views[-1]
        numel, per, plan = buffer.numel(), result.numel(), []
        for start in range(0, numel, per):
            m = min(per, numel - start)
            share = -(-m // self.world_size)
            lo, hi = min(self.rank * share, m), min((self.rank + 1) * share, m)
            terms = [slot[lo:hi] for slot in slots] if lo < hi else None
            plan.append((start, start + m, slots[self.rank][:m], terms, result[lo:hi], result[:m]))
        self._plans[key] = plan
        return plan


def _shm_state(timeout_s: float, *, required: bool = True) -> _ShmState | None:
    """The exchange's segment and state; collective over the default group (None: not mapped, see map_segment)."""
    import torch.distributed as dist

    world_size = dist.get_world_size()
    mapped = map_segment((world_size + 1) * _PIECE_BYTES, required=required, what="wrap(comm='shm')",
                         fix="use comm=None (exact DDP) otherwise")
    if mapped is None:
        return None
    return _ShmState(mapped[0], mapped[1], dist.get_rank(), world_size, timeout_s)


def _shm_hook(state, bucket):
    """A comm hook: average the bucket over ranks through the shared segment, piece by piece.

    For each piece: every rank writes piece/world_size into its slot; barrier; rank r sums share r
    of every slot in rank order into the result slot; barrier; every rank copies the result back
    into its bucket. The same summation order everywhere gives bit-identical replicas; on 2 ranks
    it is the same a/2 + b/2 PyTorch's all-reduce computes. Unannotated: DDP rejects others'
    annotations (see `_compress_hook`).
    """
    if state.user is not None:
        return state.user[1](state.user[0], bucket)
    buffer = bucket.buffer()
    if buffer.is_sparse or not buffer.is_contiguous():
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook(None, bucket)
    return _exchange(state, buffer)


def _exchange_impl(state: _ShmState, buffer: torch.Tensor):
    import torch

    world, flat = state.world_size, buffer.view(-1)
    for start, stop, mine, terms, out, result in state.plan(buffer):
        piece = flat[start:stop]
        torch.div(piece, world, out=mine)
        state.barrier()
        if terms is not None:
            torch.add(terms[0], terms[1], out=out)
            for term in terms[2:]:
                out.add_(term)
        state.barrier()
        piece.copy_(result)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


_exchange = traced("shm_all_reduce", _exchange_impl)
"""The exchange as hang forensics and `ddpkit check` see it: a collective named shm_all_reduce."""

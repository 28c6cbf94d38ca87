"""Wrap a model for DDP (or shard it with FSDP2) with checked options; accumulate gradients without extra all-reduces; hash it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

from ddpkit.parallel.strategy import find_ddp, unwrap

__all__ = ["wrap", "accumulate", "param_sha256", "DDP_DEFAULTS", "STRATEGIES"]

STRATEGIES = ("ddp", "fsdp")
"""wrap(strategy=...): 'ddp' replicates the model on every rank; 'fsdp' shards it (see ddpkit.parallel.fsdp)."""

DDP_DEFAULTS: dict[str, Any] = {
    "gradient_as_bucket_view": True,
}
"""DDP options ddpkit passes unless told otherwise (see wrap's docstring for why).

Every other option reaches DDP only when the user sets it. DDP tells a default from a value
passed explicitly: `bucket_cap_mb=25` given by hand (even PyTorch's own default value) switches off
its small first bucket (1 MiB, whose all-reduce starts early in backward) and no longer matches
torch.compile's DDPOptimizer buckets. `broadcast_buffers` likewise (torch >= 2.13 deprecates the
name in favour of `forward_sync_buffers`, whose init-time behaviour differs)."""

_TYPES: dict[str, tuple[type, ...]] = {
    "find_unused_parameters": (bool,),
    "static_graph": (bool,),
    "gradient_as_bucket_view": (bool,),
    "bucket_cap_mb": (int, float),
    "broadcast_buffers": (bool,),
}


def _check_options(options: dict[str, Any]) -> dict[str, Any]:
    merged = dict(DDP_DEFAULTS)
    for name, value in options.items():
        if name not in _TYPES:
            hint = ""
            if name in ("device_ids", "output_device"):
                hint = "; ddpkit sets device_ids itself (none on CPU, [local_rank] on CUDA)"
            elif name in ("shuffle", "batch_size", "num_workers", "sampler", "pin_memory"):
                hint = f"; {name} is a data-loader option: pass it to ddpkit.loader"
            raise TypeError(f"wrap() got unknown DDP option {name!r}; known: {', '.join(_TYPES)}{hint}")
        want = _TYPES[name]
        if isinstance(value, bool) and bool not in want or not isinstance(value, want):
            raise TypeError(
                f"wrap() option {name}={value!r} must be {' or '.join(t.__name__ for t in want)}"
            )
        merged[name] = value
    if "bucket_cap_mb" in merged and merged["bucket_cap_mb"] <= 0:
        raise ValueError(f"bucket_cap_mb={merged['bucket_cap_mb']} must be > 0 (leave it out for PyTorch's default: "
                         "a 1 MiB first bucket, then 25 MiB)")
    return merged


def wrap(
    model: torch.nn.Module,
    ctx: Context,
    *,
    sync_batchnorm: bool = False,
    compile: bool | dict[str, Any] = False,
    comm: str | None = None,
    strategy: str = "ddp",
    shard_modules: tuple[type, ...] | None = None,
    reshard_after_forward: bool = True,
    precision: Any = None,
    init_weights: Callable[[torch.nn.Module], None] | None = None,
    **ddp_options: Any,
) -> torch.nn.Module:
    """Move `model` to the rank's device and wrap it in DistributedDataParallel.

    At world size 1 the model is returned unwrapped (DDP would only add copies). A model with no
    parameter that requires grad (a fixed decoder, a frozen teacher) has nothing to average and DDP
    refuses it: it is moved, gets rank 0's parameters and buffers, and is returned unwrapped with a
    one-line warning. A class whose own `.to()` returns None (it moves some parts in place) keeps its
    `.to()` run and is then moved whole by `nn.Module.to`. Collective: all ranks must call it. On CPU no
    `device_ids` are passed (DDP rejects them there); on CUDA `device_ids=[local_rank]`.

    Defaults: `gradient_as_bucket_view=True` (gradients alias the all-reduce buckets: one copy and
    one gradient-sized buffer less per step, same numbers); every other option is DDP's own
    default, and is passed to DDP only when given here (DDP treats an explicit `bucket_cap_mb`,
    even 25, as a reason to drop its 1 MiB first bucket): `find_unused_parameters=False` (the
    extra graph traversal costs every step; set it True if some parameters get no gradient);
    `static_graph=False` (set True when the graph is the same every step, which also makes
    activation checkpointing work). DDP broadcasts rank 0's parameters and buffers at wrap time, so
    every rank starts from the same model.

    Args:
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm (statistics over the global batch).
            CUDA only (PyTorch's DDP refuses SyncBatchNorm on CPU): on CPU it is skipped with a
            warning, so a GPU script still runs on a CPU box, with per-rank statistics.
        compile: torch.compile the model: True, or a dict of torch.compile options, e.g.
            {"mode": "max-autotune"} or {"backend": "aot_eager"} (traces and runs eagerly: no C++
            compiler, no kernel build time). Under DDP (and at world size 1) your module's forward
            is compiled in place inside the wrapper, so every module class compiles (nn.Sequential
            included) and DDP's bucket boundaries still split the graph; the model returned is
            the DDP wrapper (or your module). Under FSDP the sharded model is compiled as a whole.
        comm: how gradients are averaged. None (default): PyTorch's own DDP all-reduce, no comm
            hook, on every device. Opt-in hooks (see ddpkit.parallel.comm): 'fp16' or 'bf16' all-reduce
            16-bit gradients (half the bytes, rounded); 'shm' averages float32 gradients through
            POSIX shared memory instead of gloo's loopback TCP (CPU ranks on one host only,
            bit-identical to None on 2 ranks; ValueError on CUDA or across hosts). An opt-in hook
            holds DDP's one hook slot; register a hook of your own on a comm=None model. DDP only.
        strategy: 'ddp' (default): every rank holds the whole model, DDP all-reduces gradients.
            'fsdp': FSDP2's fully_shard, with parameters, gradients and optimizer state 1/W per rank
            (build the optimizer from the returned model's parameters; docs/fsdp.md). At world size
            1 both return the module (no process group exists to shard over).
        shard_modules: FSDP only: classes whose instances become sharding units, e.g.
            (TransformerBlock,); default: each child of a ModuleList/Sequential holding at least
            ddpkit.parallel.fsdp.MIN_UNIT_PARAMS parameters. The root is always the last unit.
        reshard_after_forward: FSDP only: True (default, ZeRO-3) frees a unit's gathered
            parameters after its forward and gathers them again for backward; False keeps them
            (ZeRO-2-like: less communication, more memory).
        precision: FSDP only: a ddpkit.Precision (or 'bf16'); bf16 maps onto FSDP2's
            MixedPrecisionPolicy (bf16 compute and all-gathers, fp32 gradient reduction). Under DDP
            it is refused (a ValueError): there the Precision object's autocast does the casting.
        init_weights: for a model built on the meta device (`with torch.device("meta"): model =
            Model()`): `init_weights(model)` initialises its parameters and buffers once they have
            memory; default: each submodule's `reset_parameters()`. Under FSDP the model is sharded
            first and each rank materialises only its shards (1/W of the parameters), so a model
            larger than one device fits; under DDP every rank materialises the whole model and
            rank 0's values are broadcast. Refused for a model that is not on the meta device.
        **ddp_options: find_unused_parameters, static_graph, gradient_as_bucket_view,
            bucket_cap_mb, broadcast_buffers (DDP only).
    """
    import torch

    from ddpkit.runtime import Context

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap() needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(ctx, Context):
        raise TypeError(f"wrap(model, ctx) needs the Context ddpkit.init() returned as ctx, got {type(ctx).__name__}")
    if not isinstance(sync_batchnorm, bool):
        raise TypeError(f"wrap(sync_batchnorm={sync_batchnorm!r}) must be True or False")
    if not (compile is True or compile is False or isinstance(compile, dict)):
        raise TypeError(f"wrap(compile={compile!r}) must be True, False or a dict of torch.compile options")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ValueError("wrap() got a model that is already DistributedDataParallel; pass the plain module")
    fsdp, shard_modules = _check_strategy(strategy, comm, ddp_options, shard_modules, reshard_after_forward,
                                           precision)
    options = _check_options(ddp_options)
    from ddpkit.parallel.comm import check_comm, register_comm

    comm = check_comm(comm, ctx, stacklevel=2)
    from ddpkit.parallel.fsdp import materialize, on_meta

    meta = on_meta(model)
    if init_weights is not None and not callable(init_weights):
        raise TypeError(f"wrap(init_weights={init_weights!r}) must be a function fn(model) that initialises the "
                        "model's parameters and buffers")
    if init_weights is not None and not meta:
        raise ValueError(f"wrap(init_weights={init_weights!r}) applies to a model built on the meta device; build it "
                         "under `with torch.device('meta'):`, or drop init_weights")
    frozen = not any(p.requires_grad for p in model.parameters())
    if not meta:
        moved = model.to(ctx.device)
        if isinstance(moved, torch.nn.Module):
            model = moved
        else:  # a class's own .to() that moves some parts and returns None: the model is kept, and moved whole
            torch.nn.Module.to(model, ctx.device)
    elif frozen or not (fsdp and ctx.distributed):  # nothing to shard over (or to train): memory for the whole model here
        materialize(model, ctx.device, init_weights)
    if ctx.distributed and frozen:
        _broadcast_state(model)
        import warnings

        warnings.warn(f"wrap(): {type(model).__name__} has no parameter that requires grad, so there is nothing to "
                      f"average: it is returned on {ctx.device} without {'FSDP' if fsdp else 'DDP'} (rank 0's "
                      "parameters and buffers copied to every rank)", stacklevel=2)
    elif ctx.distributed:
        if sync_batchnorm and ctx.device.type == "cpu":
            import warnings

            warnings.warn("wrap(sync_batchnorm=True) is skipped on CPU: PyTorch's SyncBatchNorm runs on CUDA "
                          "only, so BatchNorm statistics stay per rank here", stacklevel=2)
        elif sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if fsdp:
            from ddpkit.parallel.fsdp import shard

            model = shard(model, ctx, shard_modules=shard_modules, reshard_after_forward=reshard_after_forward,
                          precision=precision)
            if meta:  # sharded on the meta device: each rank now gets memory for its own shards only
                materialize(model, ctx.device, init_weights, distributed=True)
        else:
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **options)
            register_comm(model, comm, timeout_s=ctx.timeout_s)
            from ddpkit.profile import watch_model

            watch_model(ctx, model)  # a no-op unless profiling (ddpkit.profile)
    elif fsdp:
        from ddpkit.parallel.fsdp import mixed_precision_policy, shard_units

        shard_units(model, shard_modules)  # the same one-line errors at world size 1
        mixed_precision_policy(precision)
    if compile is False:
        return model
    options = compile if isinstance(compile, dict) else {}
    if fsdp:
        return torch.compile(model, **options)
    _compile_forward(unwrap(model), options)
    return model


def _broadcast_state(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank, as DDP does at wrap time. Collective."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _compile_forward(module: torch.nn.Module, options: dict[str, Any]) -> None:
    """Compile `module`'s forward in place, through a function of this file.

    Compiling the DDP wrapper (or `module.compile()`) leaves dynamo a frame in torch's own files
    to start from, under DDP's forward, which dynamo never traces into: an nn.Sequential (whose
    forward is torch's) then compiled nothing at world size > 1. A frame here is user code to
    dynamo, which inlines any forward from it. DDP's forward still runs around it, so dynamo's
    DDPOptimizer splits the graph at DDP's buckets, as for a compiled DDP model.
    """
    import sys

    import torch

    if type(module).__module__ not in sys.modules:
        # a class from a file loaded without registering its module: dynamo cannot import it by name to
        # inline its forward from here, but traces it from torch's call path (user code, so it compiles)
        module.compile(**options)
        return
    forward = type(module).forward  # the class's: the instance attribute set below must not call itself

    def compiled_forward(*args: Any, **kwargs: Any) -> Any:
        return forward(module, *args, **kwargs)

    module.forward = torch.compile(compiled_forward, **options)


def _check_strategy(strategy: Any, comm: Any, ddp_options: dict[str, Any], shard_modules: Any,
                    reshard_after_forward: Any, precision: Any = None) -> tuple[bool, tuple[type, ...] | None]:
    """(whether wrap shards, shard_modules as a tuple); refuses options the chosen strategy does not have."""
    if strategy not in STRATEGIES:
        raise ValueError(f"wrap(strategy={strategy!r}) is not one of {', '.join(map(repr, STRATEGIES))}; pass "
                         "strategy='ddp' (replicate the model) or strategy='fsdp' (shard it)")
    if not isinstance(reshard_after_forward, bool):
        raise TypeError(f"wrap(reshard_after_forward={reshard_after_forward!r}) must be True or False")
    if strategy == "ddp":
        if precision is not None:
            raise ValueError(f"wrap(precision={precision!r}) applies to strategy='fsdp' only: under DDP the casting is "
                             "autocast's; drop precision= and run the step through ddpkit.Precision(ctx, ...)")
        if shard_modules is not None or reshard_after_forward is not True:
            name = "shard_modules" if shard_modules is not None else "reshard_after_forward"
            raise ValueError(f"wrap({name}=...) applies to strategy='fsdp' only; pass strategy='fsdp' or drop {name}")
        return False, None
    if comm not in (None, "auto"):
        raise ValueError(f"wrap(strategy='fsdp', comm={comm!r}): comm= chooses DDP's all-reduce, and FSDP "
                         "reduce-scatters gradients itself; drop comm= (or use strategy='ddp')")
    if ddp_options:
        name = next(iter(ddp_options))
        raise ValueError(f"wrap(strategy='fsdp', {name}=...): {name} is a DistributedDataParallel option, and FSDP "
                         "has no such setting; drop it (or use strategy='ddp')")
    if shard_modules is not None:
        classes = shard_modules if isinstance(shard_modules, (tuple, list)) else (shard_modules,)
        if not classes or not all(isinstance(c, type) for c in classes):
            raise TypeError(f"wrap(shard_modules={shard_modules!r}) must be a tuple of module classes, "
                            "e.g. shard_modules=(TransformerBlock,)")
        shard_modules = tuple(classes)
    return True, shard_modules


@contextlib.contextmanager
def accumulate(model: torch.nn.Module, *, sync: bool) -> Iterator[None]:
    """Run one micro-step's forward and backward; all-reduce gradients only when `sync` is True.

    Put both forward and backward inside: DDP decides at forward time whether the following
    backward all-reduces, so `no_sync` around backward alone does nothing. With k micro-steps and
    `sync=True` on the last one, gradients accumulate locally and cost one all-reduce per
    optimizer step instead of k. The loader's `step_end` flag is the usual `sync` value.
    """
    if not isinstance(sync, bool) and type(sync).__name__ not in ("bool_", "bool"):  # numpy's bool is fine too
        raise TypeError(f"accumulate(model, sync={sync!r}) must be True or False, e.g. sync=loader.step_end")
    from ddpkit.parallel.fsdp import no_gradient_sync
    from ddpkit.parallel.strategy import find_fsdp

    ddp, fsdp = find_ddp(model), find_fsdp(model)
    if sync or (ddp is None and fsdp is None):
        yield
    elif fsdp is not None:  # FSDP decides in backward (set_requires_gradient_sync), not at forward time
        with no_gradient_sync(fsdp):
            yield
    else:
        with ddp.no_sync():
            yield


def param_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the unwrapped model's state (names, dtypes, shapes, bytes): equal means bit-identical.

    For an FSDP model it hashes the full parameters, gathered shard by shard: a collective there
    (every rank must call it, and every rank gets the same digest, equal to the unsharded model's).
    """
    import hashlib

    import torch

    from ddpkit.parallel.strategy import full_tensor

    h = hashlib.sha256()
    for name, tensor in sorted(unwrap(model).state_dict().items()):
        t = full_tensor(tensor.detach()).cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


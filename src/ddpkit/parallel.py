"""Wrap a model for DDP with checked options; unwrap it; accumulate gradients without extra all-reduces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["wrap", "unwrap", "find_ddp", "accumulate", "param_sha256", "DDP_DEFAULTS"]

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
    **ddp_options: Any,
) -> torch.nn.Module:
    """Move `model` to the rank's device and wrap it in DistributedDataParallel.

    At world size 1 the model is returned unwrapped (DDP would only add copies). On CPU no
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
        compile: apply torch.compile after wrapping (the order DDP's optimizer needs): True, or a
            dict of torch.compile options, e.g. {"mode": "max-autotune"} or {"backend": "aot_eager"}
            (traces and runs eagerly: no C++ compiler, no kernel build time).
        comm: how gradients are averaged. None (default): PyTorch's own DDP all-reduce, no comm
            hook, on every device. Opt-in hooks (see ddpkit.comm): 'fp16' or 'bf16' all-reduce
            16-bit gradients (half the bytes, rounded); 'shm' averages float32 gradients through
            POSIX shared memory instead of gloo's loopback TCP (CPU ranks on one host only,
            bit-identical to None on 2 ranks; ValueError on CUDA or across hosts). An opt-in hook
            holds DDP's one hook slot; register a hook of your own on a comm=None model.
        **ddp_options: find_unused_parameters, static_graph, gradient_as_bucket_view,
            bucket_cap_mb, broadcast_buffers.
    """
    import torch

    from ddpkit.runtime import Context

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap() needs a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(ctx, Context):
        raise TypeError(f"wrap(model, ctx) needs the Context ddpkit.init() returned as ctx, got {type(ctx).__name__}")
    if not isinstance(sync_batchnorm, bool):
        raise TypeError(f"wrap(sync_batchnorm={sync_batchnorm!r}) must be True or False")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ValueError("wrap() got a model that is already DistributedDataParallel; pass the plain module")
    options = _check_options(ddp_options)
    from ddpkit.comm import check_comm, register_comm

    comm = check_comm(comm, ctx, stacklevel=2)
    model = model.to(ctx.device)
    if ctx.distributed:
        if sync_batchnorm and ctx.device.type == "cpu":
            import warnings

            warnings.warn("wrap(sync_batchnorm=True) is skipped on CPU: PyTorch's SyncBatchNorm runs on CUDA "
                          "only, so BatchNorm statistics stay per rank here", stacklevel=2)
        elif sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **options)
        register_comm(model, comm, timeout_s=ctx.timeout_s)
    if isinstance(compile, dict):
        model = torch.compile(model, **compile)
    elif compile is True:
        model = torch.compile(model)
    elif compile is not False:
        raise TypeError(f"wrap(compile={compile!r}) must be True, False or a dict of torch.compile options")
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside DDP and/or torch.compile wrappers (for saving and evaluation).

    Its state_dict has no `module.` or `_orig_mod.` prefixes.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unwrap() needs a torch.nn.Module (what ddpkit.wrap returned), got {type(model).__name__}")
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not _is_wrapper(model):
            return model
        model = inner


def _is_wrapper(model: Any) -> bool:
    import torch

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return True
    return type(model).__name__ == "OptimizedModule" or hasattr(model, "_orig_mod")


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
    ddp = find_ddp(model)
    if sync or ddp is None:
        yield
    else:
        with ddp.no_sync():
            yield


def find_ddp(model: Any):
    """The DistributedDataParallel module inside `model` and its torch.compile wrappers (None: not DDP)."""
    import torch

    while model is not None:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model
        model = getattr(model, "_orig_mod", None)
    return None


def param_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the unwrapped model's state (names, dtypes, shapes, bytes): equal means bit-identical."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(unwrap(model).state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


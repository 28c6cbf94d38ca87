"""The few private torch names ddpkit relies on, each behind a version gate, in one place.

Every function here states which torch releases it was checked against; outside that range it
falls back or raises a clear error, and tests/unit/test_torchinternals.py fails when torch renames
or removes what it uses. Nothing else in ddpkit touches a private torch name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["abort_process_group", "nccl_flight_record", "grad_scaler_scale", "step_unless_on_device"]

# --- process-group abort and the NCCL flight recorder (runtime, watchdog) -----------------------

_ABORT_CHECKED = ("2.4", "2.14")
"""torch releases (inclusive, by major.minor) whose `distributed_c10d._abort_process_group` was checked."""


def _torch_minor() -> Any:
    import torch
    from packaging.version import Version

    v = Version(torch.__version__.split("+")[0])
    return Version(f"{v.major}.{v.minor}")


def _in_range(checked: tuple[str, str]) -> bool:
    from packaging.version import Version

    return Version(checked[0]) <= _torch_minor() <= Version(checked[1])


def abort_process_group() -> bool:
    """Abort every process group without waiting for in-flight collectives; False when torch has no abort.

    `destroy_process_group()` shuts backends down gracefully, which since torch 2.6 waits for the
    NCCL work in flight: on an error path, with a peer dead or stuck, that never returns. torch has
    no public abort, only `distributed_c10d._abort_process_group` (ncclCommAbort under NCCL).
    """
    if not _in_range(_ABORT_CHECKED):
        return False
    import torch.distributed.distributed_c10d as c10d

    abort = getattr(c10d, "_abort_process_group", None)
    if abort is None:
        return False
    abort()
    return True


_RECORDER_CHECKED = ("2.4", "2.14")


def nccl_flight_record(*, only_active: bool = False) -> dict[str, Any] | None:
    """This process's NCCL flight-recorder buffer (torch's dict with 'entries'), or None without one.

    None on builds without NCCL, outside the checked releases, or when the recorder is off
    (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE unset).
    """
    if not _in_range(_RECORDER_CHECKED):
        return None
    import pickle

    import torch

    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_nccl_trace", None)
    if dump is None:
        return None
    try:
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=only_active)
    except RuntimeError:  # no NCCL process group yet, or the recorder is disabled
        return None
    data = pickle.loads(raw)
    return data if isinstance(data, dict) else None


_SCALER_CHECKED = ("2.3", "2.14")


def grad_scaler_scale(scaler: Any) -> Any:
    """The loss scale of a `torch.amp.GradScaler` as a tensor on its device (no host sync), or None.

    `GradScaler.get_scale()` returns a Python float, i.e. a device sync every call; the tensor lives
    in the private `_scale` (None until the first `scale()`/`unscale_()`).
    """
    if not _in_range(_SCALER_CHECKED):
        raise RuntimeError(f"ddpkit's GradScaler access is checked for torch {_SCALER_CHECKED[0]}-{_SCALER_CHECKED[1]}; "
                           "upgrade ddpkit for this torch release")
    return scaler._scale


_FOUND_INF_CHECKED = ("2.3", "2.14")


def step_unless_on_device(optimizer: Any, skip: Any) -> bool:
    """`optimizer.step()` skipped on the device where `skip` (a 0-dim tensor) is true; False if it cannot.

    torch's fused optimizers (`fused=True` Adam, AdamW, SGD, ...) mark themselves with the private
    `_step_supports_amp_scaling` and read a `found_inf` tensor that makes their kernel leave the
    parameters and step counts alone - the way GradScaler skips a step without reading a flag on
    the host. Other optimizers return False: the caller must decide on the host.
    """
    if not _in_range(_FOUND_INF_CHECKED) or not getattr(optimizer, "_step_supports_amp_scaling", False):
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

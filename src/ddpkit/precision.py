"""Mixed precision for the training step: autocast, fp16 loss scaling, unscale-before-clip, skipped steps."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ddpkit.profile import profiler_for

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["Precision", "StepInfo", "DTYPES", "resolve_dtype", "native_bf16", "cpuinfo_has_bf16"]

DTYPES = ("bf16", "fp16", "fp32", "auto")
"""Accepted `dtype=` values. 'auto': bf16 where the hardware computes it natively, else fp16 (loss-scaled)
on CUDA, else fp32."""

_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


class StepInfo:
    """What one `Precision.step` did; the same on every rank (the gradients it saw were all-reduced).

    The values stay tensors on the device until read: reading `grad_norm`, `skipped` or `scale`
    converts (a device sync, once per field); `grad_norm_tensor` never does. A loop that logs every
    N steps therefore syncs every N steps, not every step.
    """

    __slots__ = ("_grad_norm", "_skipped", "_scale")

    def __init__(self, *, grad_norm: Any, skipped: Any, scale: Any) -> None:
        self._grad_norm, self._skipped, self._scale = grad_norm, skipped, scale

    @property
    def grad_norm(self) -> float:
        """Global L2 norm of the unscaled gradients before clipping (inf or nan when they overflowed)."""
        if not isinstance(self._grad_norm, float):
            self._grad_norm = float(self._grad_norm)
        return self._grad_norm

    @property
    def grad_norm_tensor(self) -> Any:
        """`grad_norm` as it was computed (a 0-dim tensor on the device, no sync), or the float given."""
        return self._grad_norm

    @property
    def skipped(self) -> bool:
        """True when the optimizer step was skipped because a gradient was inf or nan."""
        if not isinstance(self._skipped, bool):
            self._skipped = bool(self._skipped)
        return self._skipped

    @property
    def scale(self) -> float:
        """fp16 loss scale after this step's update (1.0 for bf16 and fp32, which do not scale)."""
        if not isinstance(self._scale, float):
            self._scale = float(self._scale)
        return self._scale

    def as_dict(self) -> dict[str, float | bool]:
        """The fields as a dict, for `MetricsLog.log(step=..., **info.as_dict())` (reads them: a sync)."""
        return {"grad_norm": self.grad_norm, "skipped": self.skipped, "scale": self.scale}

    def __repr__(self) -> str:
        return f"StepInfo(grad_norm={self.grad_norm!r}, skipped={self.skipped!r}, scale={self.scale!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepInfo) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]


def cpuinfo_has_bf16(cpuinfo: str) -> bool:
    """True when /proc/cpuinfo text lists a native bfloat16 instruction set: AVX512_BF16 or AMX-BF16 (x86),
    BF16 (aarch64)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() in ("flags", "features"):
            flags = set(value.split())
            if flags & {"avx512_bf16", "amx_bf16", "bf16"}:
                return True
    return False


def native_bf16(device: torch.device) -> bool:
    """True when `device` computes bfloat16 in hardware, not through emulation.

    CUDA: compute capability 8.0+ (`torch.cuda.is_bf16_supported(including_emulation=False)`; with
    emulation, V100 and T4 report True and run bf16 far slower than fp16). CPU: the flags of
    /proc/cpuinfo; without them (another OS, or no such flag) False: on a CPU without AVX512_BF16 or
    AMX a bf16 matmul is tens of times slower than fp32.
    """
    import torch

    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpuinfo_has_bf16(f.read())
    except OSError:
        return False


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """'auto' -> a concrete dtype name for `device`; other names are checked and returned."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}; pass e.g. dtype='auto'")
    if dtype != "auto":
        return dtype
    if native_bf16(device):
        return "bf16"
    return "fp16" if device.type == "cuda" else "fp32"


class Precision:
    """Autocast, loss scaling and the optimizer step for one training loop.

        prec = ddpkit.Precision(ctx)   # dtype="auto": bf16 where the hardware has it
        with ddpkit.accumulate(model, sync=data.step_end):
            with prec.autocast():
                loss = loss_fn(model(x), y)
            prec.backward(loss / data.accumulation_steps)
        if data.step_end:
            info = prec.step(opt, model, max_grad_norm=1.0)   # StepInfo(grad_norm, skipped, scale)

    bf16 has fp32's exponent range: autocast only. fp16 overflows easily, so its loss is scaled
    by a `torch.amp.GradScaler` (CUDA, and CPU where torch supports it), which skips a step whose
    gradients hold inf/nan and lowers the scale. fp32 runs the same calls with autocast off.
    Parameters and optimizer state stay fp32 in every mode.
    """

    def __init__(self, ctx: Context, dtype: str = "auto", *, init_scale: float = 2.0**16,
                 growth_interval: int = 2000) -> None:
        import torch

        self.ctx = ctx
        self.dtype = resolve_dtype(dtype, ctx.device)
        self.device_type = ctx.device.type
        if self.device_type not in ("cuda", "cpu"):
            raise ValueError(f"Precision supports cuda and cpu devices, got {ctx.device}; use dtype='fp32' there")
        if self.dtype == "bf16" and self.device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(
                f"dtype='bf16' on {ctx.device}, which does not support bfloat16 (needs compute capability 8.0+); "
                "pass dtype='fp16' (loss-scaled) or 'auto'"
            )
        if self.dtype == "bf16" and dtype == "bf16" and ctx.is_main and not native_bf16(ctx.device):
            import warnings

            where = ("this CPU has no AVX512_BF16/AMX" if self.device_type == "cpu"
                     else f"{ctx.device} is older than sm80")
            fallback = "fp32" if self.device_type == "cpu" else "fp16, loss-scaled"
            warnings.warn(f"Precision(dtype='bf16'): {where}, so bfloat16 is emulated and slower than "
                          f"{'fp32' if self.device_type == 'cpu' else 'fp16'}; pass dtype='auto' ({fallback} here)",
                          stacklevel=2)
        self.torch_dtype = getattr(torch, _TORCH_DTYPE[self.dtype]) if self.dtype in _TORCH_DTYPE else None
        self.scaler = (
            torch.amp.GradScaler(self.device_type, init_scale=init_scale, growth_interval=growth_interval)
            if self.dtype == "fp16" else None
        )
        self._skipped: Any = 0  # a device tensor once a step ran: counted without reading it
        self._warned_unfused = False

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far because gradients held inf/nan (reading it syncs)."""
        return int(self._skipped)

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._skipped = int(value)

    def __repr__(self) -> str:
        return f"Precision(dtype={self.dtype!r}, device_type={self.device_type!r}, skipped_steps={self.skipped_steps})"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the forward pass (and the loss) in lower precision where it is safe; no-op for fp32."""
        import torch

        if self.torch_dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.torch_dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """`loss.backward()`, with the loss multiplied by the current scale under fp16."""
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
        prof = profiler_for(self.ctx)
        if prof is not None:
            prof.mark_backward()

    def step(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None, *,
             max_grad_norm: float | None = None, zero_grad: bool = True) -> StepInfo:
        """Unscale, measure (and clip) the gradient norm, step unless it is inf/nan, update the scale.

        Call it once per optimizer step, after the backward that all-reduced the gradients (the
        last micro-step under accumulation). Not a collective: DDP already averaged the gradients,
        so every rank computes the same norm, clips by the same factor and takes (or skips) the
        same step without talking to the others.

        Args:
            model: whose parameters are measured and clipped; default the optimizer's parameters.
            max_grad_norm: clip the global L2 norm of all gradients to this value; None: no clipping
                (the norm is still measured and returned).
            zero_grad: set the gradients to None afterwards, ready for the next step's backward.
        """
        import torch

        from ddpkit.parallel.strategy import full_tensor, is_dtensor

        if max_grad_norm is not None and not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm={max_grad_norm!r} must be a finite number > 0 (e.g. 1.0) or None")
        prof = profiler_for(self.ctx)
        if prof is not None:
            prof.mark_optimizer(started=True)
        params = _parameters(optimizer, model)
        if self.scaler is not None and any(is_dtensor(p) for p in params):
            from ddpkit.parallel.fsdp import refuse_fp16

            refuse_fp16("Precision('fp16').step on an FSDP model")
        if self.scaler is not None:
            # Clip the true gradients, not the scaled ones: a threshold of 1.0 against gradients
            # multiplied by 65536 would clip every step. unscale_ also records whether any
            # gradient is inf/nan, which makes scaler.step skip the optimizer step.
            self.scaler.unscale_(optimizer)
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        elif hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6; DTensor-aware
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        else:
            # What clip_grad_norm_ measures, without scaling.
            norms = [torch.linalg.vector_norm(p.grad.detach(), 2.0, dtype=torch.float32)
                     for p in params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(norms), 2.0) if norms else torch.zeros(())
        # Under FSDP the gradients are DTensor shards and the norm a replicated DTensor: torch
        # summed the squares over every rank's shards, so it is the global norm, the same everywhere.
        norm = full_tensor(norm)
        # Nothing below reads a value on the host: on CUDA that would wait for the whole backward
        # every step and leave the GPU idle while the next step's kernels are launched.
        if self.scaler is not None:
            from ddpkit.torchinternals import grad_scaler_scale

            before = grad_scaler_scale(self.scaler).clone()
            self._warn_unfused(optimizer)  # GradScaler reads found_inf on the host for unfused optimizers
            self.scaler.step(optimizer)  # skips on inf/nan (on the device with a fused optimizer)
            self.scaler.update()
            scale = grad_scaler_scale(self.scaler).clone()
            # The scale drops (by backoff_factor < 1) exactly when inf/nan was found.
            skipped = scale < before
        else:
            from ddpkit.torchinternals import step_unless_on_device

            # Same rule without a scaler: an inf/nan step would poison the weights and the
            # optimizer state for good. Skipping is identical on every rank because the norm is.
            skipped = ~torch.isfinite(norm)
            if not step_unless_on_device(optimizer, skipped):
                # An unfused optimizer cannot skip on the device: one flag read (a sync on CUDA).
                # Undoing a step on the device instead would keep a copy of every parameter and
                # all optimizer state; torch's GradScaler reads the same flag for these optimizers.
                self._warn_unfused(optimizer)
                if not bool(skipped):
                    optimizer.step()
            scale = 1.0
        self._skipped = self._skipped + skipped.to(torch.int64)
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        if prof is not None:
            prof.mark_optimizer(started=False)
        return StepInfo(grad_norm=norm.detach(), skipped=skipped, scale=scale)

    def _warn_unfused(self, optimizer: torch.optim.Optimizer) -> None:
        """Once, on CUDA: the optimizer has a fused kernel that would skip on the device, unused."""
        if self._warned_unfused or self.device_type != "cuda" or not self.ctx.is_main:
            return
        self._warned_unfused = True
        if "fused" in getattr(optimizer, "defaults", {}) and not any(g.get("fused") for g in optimizer.param_groups):
            import warnings

            name = type(optimizer).__name__
            warnings.warn(f"Precision.step: {name} is not fused, so skipping a step whose gradients hold inf/nan "
                          "reads a flag on the host every step (the GPU waits for the host to launch the next "
                          f"step); pass fused=True to {name} to skip on the device", stacklevel=3)

    def state_dict(self) -> dict[str, Any]:
        """Loss-scale state and the skipped-step count, for checkpoints (resume keeps the scale)."""
        return {
            "dtype": self.dtype,
            "skipped_steps": self.skipped_steps,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved; the dtype must match."""
        if state["dtype"] != self.dtype:
            raise ValueError(
                f"checkpoint was trained with dtype={state['dtype']!r} but this Precision uses {self.dtype!r}; "
                f"pass dtype={state['dtype']!r} to resume with the same loss scaling"
            )
        self.skipped_steps = int(state["skipped_steps"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _parameters(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> list[torch.Tensor]:
    source: Iterable[torch.Tensor] = (model.parameters() if model is not None else
                                      (p for group in optimizer.param_groups for p in group["params"]))
    return [p for p in source if p.requires_grad]

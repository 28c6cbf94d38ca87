"""Mixed precision for the training step: autocast, fp16 loss scaling, unscale-before-clip, skipped steps."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpkit.optim import is_sharded, optimizer_parameters

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["Precision", "StepInfo", "DTYPES", "resolve_dtype", "native_bf16", "cpuinfo_has_bf16"]

DTYPES = ("bf16", "fp16", "fp32", "auto")
"""Accepted `dtype=` values. 'auto': bf16 where the hardware computes it natively, else fp16 (loss-scaled)
on CUDA, else fp32."""

_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class StepInfo:
    """What one `Precision.step` did; the same on every rank (the gradients it saw were all-reduced)."""

    grad_norm: float
    """Global L2 norm of the unscaled gradients before clipping (inf or nan when they overflowed)."""
    skipped: bool
    """True when the optimizer step was skipped because a gradient was inf or nan."""
    scale: float
    """fp16 loss scale after this step's update (1.0 for bf16 and fp32, which do not scale)."""

    def as_dict(self) -> dict[str, float | bool]:
        """The fields as a dict, for `MetricsLog.log(step=..., **info.as_dict())`."""
        return {"grad_norm": self.grad_norm, "skipped": self.skipped, "scale": self.scale}


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
        self.skipped_steps = 0
        """Optimizer steps skipped so far because gradients held inf/nan."""

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

        if max_grad_norm is not None and not (max_grad_norm > 0 and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm={max_grad_norm!r} must be a finite number > 0 (e.g. 1.0) or None")
        params = _parameters(optimizer, model)
        if self.scaler is not None and is_sharded(optimizer):
            raise ValueError("Precision('fp16') cannot step a sharded optimizer: the loss scaler would unscale and "
                             "check this rank's pieces only; use dtype='bf16' or an unsharded optimizer")
        if self.scaler is not None:
            # Clip the true gradients, not the scaled ones: a threshold of 1.0 against gradients
            # multiplied by 65536 would clip every step. unscale_ also records whether any
            # gradient is inf/nan, which makes scaler.step skip the optimizer step.
            self.scaler.unscale_(optimizer)
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        else:
            # What clip_grad_norm_ measures, without scaling (get_total_norm needs torch >= 2.6).
            norms = [torch.linalg.vector_norm(p.grad.detach(), 2.0, dtype=torch.float32)
                     for p in params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(norms), 2.0) if norms else torch.zeros(())
        grad_norm = float(norm)
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            scale = self.scaler.get_scale()
            # The scale drops (by backoff_factor < 1) exactly when inf/nan was found.
            skipped = scale < before
        else:
            # Same rule without a scaler: an inf/nan step would poison the weights and the
            # optimizer state for good. Skipping is identical on every rank because the norm is.
            skipped = not math.isfinite(grad_norm)
            if not skipped:
                optimizer.step()
            scale = 1.0
        if skipped:
            self.skipped_steps += 1
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        return StepInfo(grad_norm=grad_norm, skipped=bool(skipped), scale=float(scale))

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
    source: Iterable[torch.Tensor] = model.parameters() if model is not None else optimizer_parameters(optimizer)
    return [p for p in source if p.requires_grad]

"""The lint checks for wrong devices and statistics (DDP011-DDP013): CUDA devices, NCCL setup, BatchNorm."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, terminal
from ddpkit.lint.rules import Hit, argument, check, keyword

__all__ = ["cuda_device_as_device", "nccl_without_set_device", "batchnorm_without_sync"]

_DEVICE_KWARGS = ("device", "output_device", "map_location", "device_id")


def _device_positions(call: ast.Call) -> Iterator[ast.AST]:
    """Expressions a call uses as a device: `.to(x)`, `.cuda(x)`, `device=x`, `device_ids=[x]`."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda"):
        yield from call.args[:1]
    for k in call.keywords:
        if k.arg in _DEVICE_KWARGS:
            yield k.value
        elif k.arg == "device_ids" and isinstance(k.value, (ast.List, ast.Tuple)):
            yield from k.value.elts


@check
def cuda_device_as_device(s: Script) -> Iterator[Hit]:
    def is_cuda_device(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and s.qualname(node.func) == "torch.cuda.device"

    holders = {t.id for n in s.nodes if isinstance(n, ast.Assign) and is_cuda_device(n.value)
               for t in n.targets if isinstance(t, ast.Name)}
    for call in s.calls:
        for expr in _device_positions(call):
            if is_cuda_device(expr) or (isinstance(expr, ast.Name) and expr.id in holders):
                yield Hit(expr, "DDP011", "error",
                          "torch.cuda.device(...) is a context manager that switches the current GPU, "
                          "not a device: used as one it fails or puts the tensors on the wrong GPU",
                          "use torch.device('cuda', local_rank) (and torch.cuda.set_device(local_rank) once)")


def _strings(s: Script, expr: ast.AST) -> set[str]:
    """String constants an expression may evaluate to, following assignments to a plain name."""
    sources = [expr]
    if isinstance(expr, ast.Name):
        sources += [n.value for n in s.nodes if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
    return {n.value for src in sources for n in ast.walk(src)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _uses_cuda(s: Script) -> bool:
    for node in s.nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.match(r"cuda(:\d+)?$", node.value):
            return True
        if isinstance(node, ast.Call) and terminal(node.func) == "cuda" and isinstance(node.func, ast.Attribute):
            return True
    return False


def _pins_device(s: Script) -> bool:
    """CUDA_VISIBLE_DEVICES set per rank, or `with torch.cuda.device(i):`, also pick the device."""
    for node in s.nodes:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.slice, ast.Constant) and node.slice.value == "CUDA_VISIBLE_DEVICES":
            return True
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call) \
                and s.qualname(node.context_expr.func) == "torch.cuda.device":
            return True
    return False


@check
def nccl_without_set_device(s: Script) -> Iterator[Hit]:
    set_device = [c for c in s.calls if terminal(c.func).startswith("set_device")]
    for call in s.calls_named("init_process_group"):
        if keyword(call, "device_id") is not None:
            continue
        backend = argument(call, "backend", 0)
        if backend is None:
            nccl = _uses_cuda(s)
        else:
            nccl = any("nccl" in v for v in _strings(s, backend))
        if not nccl or _pins_device(s):
            continue
        scope = s.context(call).scope
        same_scope = [c for c in set_device if s.context(c).scope == scope]
        if not set_device:
            yield Hit(call, "DDP012", "error",
                      "init_process_group uses NCCL but torch.cuda.set_device is never called, so the "
                      "current device of every rank stays cuda:0: NCCL communicators, barrier() and every "
                      "bare .cuda() land on one GPU",
                      "call torch.cuda.set_device(local_rank) before init_process_group, or pass "
                      "device_id=torch.device('cuda', local_rank) to it")
        elif len(same_scope) == len(set_device) and all(c.lineno > call.lineno for c in same_scope):
            yield Hit(call, "DDP012", "warning",
                      f"torch.cuda.set_device comes after init_process_group (line {same_scope[0].lineno}); "
                      "until then NCCL sees cuda:0 as every rank's device",
                      "move torch.cuda.set_device(local_rank) above init_process_group")


@check
def batchnorm_without_sync(s: Script) -> Iterator[Hit]:
    if not s.uses_ddp:
        return
    names = [n for n in s.nodes if isinstance(n, (ast.Name, ast.Attribute))]
    if any(terminal(n) in ("SyncBatchNorm", "convert_sync_batchnorm") for n in names):
        return
    first = next((n for n in names if re.fullmatch(r"BatchNorm[123]d", terminal(n))), None)
    if first is not None:
        yield Hit(first, "DDP013", "note",
                  f"{terminal(first)} under DistributedDataParallel normalises with each rank's own "
                  "per-GPU batch statistics, not the global batch's",
                  "if the per-GPU batch is small, convert before wrapping: "
                  "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")

"""The lint checks for data, checkpoint, logging and launcher mistakes (DDP001-DDP009)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ddpkit.lint.analysis import LOCAL, NONE, Script, terminal

__all__ = ["Hit", "CHECKS", "check", "keyword", "argument"]


@dataclass(frozen=True)
class Hit:
    """A finding before it is given a path: the node it points at, the rule and the advice."""

    node: ast.AST
    rule: str
    severity: str
    message: str
    fix: str


CHECKS: list[Callable[[Script], Iterator[Hit]]] = []


def check(func: Callable[[Script], Iterator[Hit]]) -> Callable[[Script], Iterator[Hit]]:
    CHECKS.append(func)
    return func


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def argument(call: ast.Call, name: str, position: int) -> ast.AST | None:
    """The value passed for a parameter, by keyword or at its position."""
    value = keyword(call, name)
    if value is None and len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        value = call.args[position]
    return value


def _is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _names_in(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)):
            yield terminal(n)


# ---- data ------------------------------------------------------------------------------------
@check
def sampler_without_set_epoch(s: Script) -> Iterator[Hit]:
    if s.calls_named("set_epoch"):
        return
    for call in s.calls_named("DistributedSampler"):
        if _is_const(argument(call, "shuffle", 3), False):
            continue
        yield Hit(call, "DDP001", "error",
                  "DistributedSampler shuffles (shuffle defaults to True) but sampler.set_epoch() is never "
                  "called, so every epoch visits the data in the same order",
                  "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader")


@check
def shuffle_beside_sampler(s: Script) -> Iterator[Hit]:
    for call in s.calls_named("DataLoader"):
        shuffle = argument(call, "shuffle", 2)
        if not _is_const(shuffle, True):
            continue
        for name, position in (("sampler", 3), ("batch_sampler", 4)):
            given = argument(call, name, position)
            if given is not None and not _is_const(given, None):
                yield Hit(shuffle, "DDP002", "error",
                          f"DataLoader gets shuffle=True together with {name}=; torch raises ValueError "
                          f"({name} option is mutually exclusive with shuffle)",
                          "remove shuffle=True from the DataLoader and let the sampler shuffle "
                          "(DistributedSampler(dataset, shuffle=True) plus sampler.set_epoch(epoch))")
                break


DDP_ONLY_KWARGS = ("find_unused_parameters", "broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view",
                   "static_graph", "device_ids", "output_device")
_NOT_DDP = frozenset({"DataLoader", "DistributedSampler", "init_process_group", "compile", "to", "cuda",
                      "FullyShardedDataParallel", "fully_shard"})


@check
def ddp_kwargs_elsewhere(s: Script) -> Iterator[Hit]:
    for call in s.calls:
        callee = terminal(call.func)
        qualname = s.qualname(call.func)
        if callee not in _NOT_DDP and not qualname.startswith(("torch.optim.", "torch.utils.data.")):
            continue
        for k in call.keywords:
            if k.arg in DDP_ONLY_KWARGS:
                yield Hit(k.value, "DDP003", "error",
                          f"{k.arg}= is an argument of DistributedDataParallel but is passed to {callee}(), "
                          "which does not accept it",
                          f"move {k.arg}= to the wrapper: DistributedDataParallel(model, {k.arg}=...)")


# ---- checkpoints -----------------------------------------------------------------------------
@check
def unguarded_save(s: Script) -> Iterator[Hit]:
    if not s.distributed:
        return
    for call in s.calls:
        if s.qualname(call.func) != "torch.save" or not s.per_rank(call):
            continue
        level = s.context(call).level
        if level == NONE:
            yield Hit(call, "DDP004", "error",
                      "torch.save runs on every rank (no rank check around it): all ranks write the same "
                      "file at once and can leave it corrupt",
                      "save from one rank: `if dist.get_rank() == 0: torch.save(...)` "
                      "(with ddpkit: `if ctx.is_main:`), then dist.barrier() if other ranks read it")
        elif level == LOCAL:
            yield Hit(call, "DDP004", "warning",
                      "torch.save is guarded by a local-rank check only: on a multi-node job local rank 0 "
                      "of every node writes the file",
                      "test the global rank instead: `if int(os.environ['RANK']) == 0:` or "
                      "`if dist.get_rank() == 0:`")


@check
def load_without_map_location(s: Script) -> Iterator[Hit]:
    if not s.distributed:
        return
    for call in s.calls:
        if s.qualname(call.func) != "torch.load":
            continue
        if argument(call, "map_location", 1) is None:
            yield Hit(call, "DDP005", "warning",
                      "torch.load without map_location puts every tensor back on the device it was saved "
                      "from (cuda:0), on every rank",
                      "pass map_location=device (e.g. torch.device('cuda', local_rank)) or map_location='cpu'")
        weights_only = keyword(call, "weights_only")
        if _is_const(weights_only, False):
            yield Hit(weights_only, "DDP005", "warning",
                      "torch.load(weights_only=False) unpickles arbitrary objects from the checkpoint",
                      "save plain state_dicts and load with weights_only=True (the default since torch 2.6)")


# ---- logging ---------------------------------------------------------------------------------
_METRIC = re.compile(r"(^|_)(acc|accuracy|correct|f1|precision|recall|auc|top1|top5|metric|metrics)($|_)"
                     r"|^(val|valid|eval|test)_?loss")
_LOG_CALLS = frozenset({"print", "info", "log", "add_scalar", "add_scalars", "write"})


@check
def unreduced_metric(s: Script) -> Iterator[Hit]:
    if not s.distributed or not s.calls_named("DistributedSampler") or "torchmetrics" in s.aliases \
            or any(re.search("reduce|gather", terminal(c.func)) for c in s.calls):
        return
    for call in s.calls:
        if terminal(call.func) not in _LOG_CALLS or s.context(call).level == NONE \
                or s.qualname(call.func).startswith(("math.", "numpy.", "torch.")):
            continue
        metric = next((n for a in (*call.args, *call.keywords) for n in _names_in(a) if _METRIC.search(n.lower())),
                      None)
        if metric is not None:
            yield Hit(call, "DDP006", "warning",
                      f"'{metric}' is reported from inside a rank check but the script never reduces across "
                      "ranks, so it describes one rank's shard (1/world_size of the data)",
                      "on every rank, put the sum and the count in a tensor, dist.all_reduce(t, "
                      "op=dist.ReduceOp.SUM) it, divide, then report on rank 0")


@check
def every_rank_prints(s: Script) -> Iterator[Hit]:
    if not s.distributed:
        return
    for call in s.calls:
        name = s.qualname(call.func)
        is_print = name in ("print", "rich.print")
        is_bar = name.split(".")[0] == "tqdm" and terminal(call.func) in ("tqdm", "trange")
        if not (is_print or is_bar) or s.context(call).level != NONE or not s.per_rank(call):
            continue
        # a rank in the message means the per-rank output is deliberate
        if any(s.kind(n) for a in (*call.args, *call.keywords) for n in ast.walk(a)):
            continue
        if is_print and keyword(call, "file") is not None:
            continue
        if is_bar and keyword(call, "disable") is not None:
            continue
        what = "print()" if is_print else "the tqdm progress bar"
        yield Hit(call, "DDP008", "warning",
                  f"{what} runs on every rank (no rank check), so the output appears world_size times",
                  "guard it with `if rank == 0:` (ddpkit: `ddpkit.print0(ctx, ...)`)" if is_print else
                  "create the bar on rank 0 only: tqdm(..., disable=(rank != 0))")


# ---- launcher and process group -----------------------------------------------------------------
_LAUNCH_FIX = "launch with `torchrun --nproc-per-node N train.py` (or `ddpkit run`) and read os.environ['LOCAL_RANK']"


@check
def deprecated_launch(s: Script) -> Iterator[Hit]:
    for node in s.nodes:
        if isinstance(node, ast.Import):
            hit = any(a.name.startswith("torch.distributed.launch") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            hit = (node.module or "").startswith("torch.distributed.launch") or (
                node.module == "torch.distributed" and any(a.name == "launch" for a in node.names))
        else:
            hit = False
        if hit:
            yield Hit(node, "DDP007", "error", "imports torch.distributed.launch, which is deprecated in favour "
                      "of torchrun and passes --local-rank instead of setting LOCAL_RANK", _LAUNCH_FIX)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "torch.distributed.launch" in node.value:
            before = node.value[:node.value.index("torch.distributed.launch")]
            at = ast.Constant(node.value, lineno=node.lineno + before.count("\n"),
                              col_offset=node.col_offset if "\n" not in before else 0)
            yield Hit(at, "DDP007", "warning",
                      "starts (or tells users to start) the deprecated `python -m torch.distributed.launch`",
                      _LAUNCH_FIX)
    for call in s.calls_named("add_argument"):
        flag = next((a.value for a in call.args if isinstance(a, ast.Constant)
                     and a.value in ("--local_rank", "--local-rank")), None)
        if flag:
            yield Hit(call, "DDP007", "warning",
                      f"argparse argument {flag} is the torch.distributed.launch contract; torchrun does not "
                      "pass it and sets the LOCAL_RANK environment variable instead",
                      "remove the argument and use local_rank = int(os.environ['LOCAL_RANK'])")


@check
def no_destroy(s: Script) -> Iterator[Hit]:
    if s.calls_named("destroy_process_group"):
        return
    for call in s.calls_named("init_process_group"):
        yield Hit(call, "DDP009", "warning",
                  "init_process_group is called but destroy_process_group never is, so the process "
                  "group's resources are not released at exit (torch warns, NCCL may hang at shutdown)",
                  "call dist.destroy_process_group() when training ends, in a `finally:` block")


"""What names, expressions and helpers say about ranks: which rank a name holds, and whether a run is distributed."""

from __future__ import annotations

import ast
import re

__all__ = ["NONE", "LOCAL", "GLOBAL", "GLOBAL_ENV", "LOCAL_ENV", "GLOBAL_CALLS", "QUERIES",
           "distributed_mode", "run_sense", "single_setting", "rank_name_kind", "is_main_flag", "is_gpu_index", "is_mode_sentinel", "terminal",
           "own_returns", "find_rank_helpers", "spawn_index_names", "rank_side", "WORLD"]

NONE, LOCAL, GLOBAL = 0, 1, 2
"""How strongly a condition singles out ranks: not at all, by local rank (one per node), by global rank."""

GLOBAL_ENV = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
LOCAL_ENV = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"})
_RANK_TOKEN = re.compile(r"^(local|global|world|ddp|my|node|proc|process|gpu|dist)?rank(\d+|zero|id)?$")
_MAIN_NAME = re.compile(
    r"^_?(is|am)_(local_|global_|node_)?(main|master|chief|leader|zero|rank_?0|rank_?zero)"
    r"(_process|_rank|_worker|_node)?$|^_?(local_)?(main|master)_(process|rank|worker)$|^_?(local_|global_)?master$"
)
_GPU_INDEX = frozenset({"gpu", "gpu_id", "gpu_idx", "local_gpu"})
"""Older scripts (mp.spawn examples) name the local rank after the GPU it drives."""
_MODE_NAME = re.compile(r"^_?(is_|use_|using_|run_)?(ddp|distributed|dist|multi_?gpu|ddp_run|data_parallel)"
                        r"(_mode|_run|_train|_training)?$")
"""Flags that say "this run is distributed at all" (`args.distributed`, `ddp`), not which rank this is."""
_MODE_CALLS = frozenset({"is_initialized", "is_dist_avail_and_initialized", "is_distributed"})
GLOBAL_CALLS = frozenset({"get_rank", "get_global_rank"})
QUERIES = frozenset({"distributed", "is_available", "is_initialized", "get_rank", "get_world_size",
                      "is_nccl_available", "is_torchelastic_launched"})
"""torch.distributed names that only ask about the process group; using only these does not make a file per-rank."""


def distributed_mode(expr: ast.AST | None) -> int:
    """+1 if `expr` being true means the run is distributed, -1 if it means a single process, else 0.

    `args.distributed`, `dist.is_initialized()`, `world_size > 1`, `'RANK' in os.environ` and
    `local_rank != -1` are +1; their negations (`not ddp`, `world_size == 1`, `rank == -1`) are -1.
    """
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return 1 if _MODE_NAME.match(terminal(expr).lower()) else 0
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
        return 1 if _MODE_NAME.match(expr.slice.value.lower()) else 0  # `config["distributed"]`
    if isinstance(expr, ast.Call):
        return 1 if terminal(expr.func) in _MODE_CALLS else 0
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return -distributed_mode(expr.operand)
    if isinstance(expr, ast.BoolOp):
        senses = {distributed_mode(v) for v in expr.values}
        if isinstance(expr.op, ast.And) and 1 in senses and -1 not in senses:
            return 1
        if isinstance(expr.op, ast.Or) and senses == {-1}:
            return -1
        return 0
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return 0
    left, op, right = expr.left, type(expr.ops[0]), expr.comparators[0]
    if terminal(left) == "launcher" and isinstance(right, ast.Constant) and right.value == "none":
        return {ast.Eq: -1, ast.NotEq: 1}.get(op, 0)  # `if args.launcher == "none":` (mmcv-style): one process
    if isinstance(left, ast.Constant) and isinstance(left.value, str) and op in (ast.In, ast.NotIn):
        if left.value in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and "environ" in ast.unparse(right):
            return 1 if op is ast.In else -1
        return 0
    value = right.value if isinstance(right, ast.Constant) and isinstance(right.value, int) else None
    if isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub) and isinstance(right.operand, ast.Constant):
        value = -right.operand.value if isinstance(right.operand.value, int) else None
    if value is None:
        return 0
    name = terminal(left).lower()
    if "world_size" in name or name in ("num_processes", "nprocs", "num_replicas"):
        if (op, value) in ((ast.Gt, 1), (ast.GtE, 2), (ast.NotEq, 1)):
            return 1
        if (op, value) in ((ast.Eq, 1), (ast.LtE, 1), (ast.Lt, 2), (ast.LtE, 0), (ast.Lt, 1), (ast.Eq, 0)):
            return -1  # (`WORLD_SIZE <= 0`: no launcher set it)
    if value == -1 and rank_name_kind(terminal(left) or "rank"):
        return {ast.Eq: -1, ast.NotEq: 1, ast.Gt: 1, ast.LtE: -1}.get(op, 0)
    if value == 0 and rank_name_kind(terminal(left) or "rank"):
        return {ast.GtE: 1, ast.Lt: -1}.get(op, 0)  # `local_rank >= 0`: -1 is the single-process sentinel
    return 0


_GPU_COUNT = re.compile(r"^(n_?|num_?)(gpus?|devices)$|^ngpus?$|^gpu_count$|^num_gpus_per_node$")
"""Counts of GPUs (`cfg.NUM_GPUS`, `n_gpu`): one process per GPU makes `num_gpus == 1` a single-process run, but in
a DataParallel script it is the GPUs of one process, so only run_sense reads it, beside a rank test."""


def run_sense(expr: ast.AST | None) -> int:
    """distributed_mode, and where that says nothing a GPU count tested against one (`cfg.NUM_GPUS == 1` is -1,
    `n_gpu > 1` is +1). For the arms of a condition that also tests the rank: `NUM_GPUS == 1 or get_rank() == 0`
    passes on rank 0 only in any multi-process run, whatever the count means in a single process."""
    sense = distributed_mode(expr)
    if sense or not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return sense
    right = expr.comparators[0]
    if not (isinstance(right, ast.Constant) and type(right.value) is int) \
            or not _GPU_COUNT.match(terminal(expr.left).lower()):
        return 0
    op, value = type(expr.ops[0]), right.value
    if (op, value) in ((ast.Gt, 1), (ast.GtE, 2), (ast.NotEq, 1)):
        return 1
    return -1 if (op, value) in ((ast.Eq, 1), (ast.LtE, 1), (ast.Lt, 2)) else 0


WORLD = re.compile(r"world_size|get_world_size|nprocs|num_gpus|ngpus|n_gpus|num_replicas|num_processes|world|"
                    r"\bws\b|n_?procs|num_?ranks|n_?ranks|gpu_?count|device_count")
"""Names of a run's world size and its process or GPU counts, matched anywhere in a name or call (`args.world_size`,
`dist.get_world_size()`, `torch.cuda.device_count()`)."""

_COUNT_NAME = re.compile(r"^(n_?|num_?)(procs|processes|replicas)$|world_size$")
"""Names that count the processes of a run (`nprocs`, `world_size`; not `n_gpu`, often the GPUs of one process)."""


def single_setting(target: ast.AST, value: ast.AST, counts: frozenset[str] = frozenset()) -> bool:
    """`world_size = 1`, `args.distributed = False`: an assignment that makes the run one process (the branch it
    sits in is a single-process fallback). `counts`: other names the program gives init_process_group as its
    world_size (`num_gpus` in `init_process_group(..., world_size=num_gpus)`)."""
    if not isinstance(value, ast.Constant) or not isinstance(target, (ast.Name, ast.Attribute)):
        return False
    name = terminal(target).lower()
    if value.value is False:
        return _MODE_NAME.match(name) is not None
    return value.value == 1 and type(value.value) is int and (_COUNT_NAME.search(name) is not None or name in counts)


def rank_name_kind(name: str) -> int:
    """GLOBAL for names like rank/is_main/get_rank/RANK, LOCAL for local_rank/LOCAL_RANK, else NONE."""
    if name in GLOBAL_ENV:
        return GLOBAL
    if name in LOCAL_ENV:
        return LOCAL
    lowered = name.lower()
    if lowered in _GPU_INDEX:
        return LOCAL
    tokens = lowered.split("_")
    if not (_MAIN_NAME.match(lowered) or _names_the_rank(tokens)):
        return NONE
    return LOCAL if any(t.startswith("local") for t in tokens) else GLOBAL


_RANK_QUALIFIERS = frozenset({"", "zero", "id", "ids", "idx", "only"})
"""Words that may follow the rank in a name of the rank itself (`rank_0`, `rank_zero_only`, `rank_id`)."""
_RANK_LINKS = frozenset({"in", "of", "on", "within", "is"})


def _names_the_rank(tokens: list[str]) -> bool:
    """A rank token that the name ends on: `global_rank`, `print_rank_0`. Where other words follow it, the rank
    qualifies something else (`val_av_rank_start_epoch` is an epoch, `per_rank_splits` a list of splits)."""
    hits = [i for i, t in enumerate(tokens) if _RANK_TOKEN.match(t)]
    if not hits:
        return False
    rest = tokens[hits[-1] + 1:]
    if rest[:1] and rest[0] in _RANK_LINKS:
        return True  # `rank_in_group`, `rank_is_zero`: the rank is still what the name holds or tests
    return all(t.isdigit() or t in _RANK_QUALIFIERS for t in rest)


def is_gpu_index(name: str) -> bool:
    """A name that holds the rank only by the habit of naming the local rank after its GPU (`gpu`, `gpu_id`)."""
    return name.lower() in _GPU_INDEX


def is_main_flag(name: str) -> bool:
    """True for names of a flag that is true on rank 0 only (is_main, master_process), not a rank number."""
    return _MAIN_NAME.match(name.lower()) is not None


def rank_side(test: ast.AST, branch: str) -> tuple[str, bool] | None:
    """(the rank expression, True for rank 0's side) of one branch of a plain rank test: `rank == 0` and
    `is_main` hold on rank 0, `rank != 0`, `rank > 0` and `not is_main` on the others, the `else:` branch flips
    it; None for any other test (`rank == 1`, `rank == 0 and step % 10 == 0`). Two calls of one function, one on
    each side of the same expression, run it on every rank (`if rank == 0: build()`, then `if rank != 0: build()`).
    """
    flip = branch != "body"
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, flip = test.operand, not flip
    if isinstance(test, (ast.Name, ast.Attribute)) and is_main_flag(terminal(test)):
        return ast.unparse(test), not flip
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == 0 and type(test.comparators[0].value) is int
            and isinstance(test.left, (ast.Name, ast.Attribute, ast.Call))):
        return None
    zero = {ast.Eq: True, ast.NotEq: False, ast.Gt: False}.get(type(test.ops[0]))
    return None if zero is None else (ast.unparse(test.left), zero != flip)


def terminal(node: ast.AST) -> str:
    """The last identifier of a name or attribute chain (`dist.all_reduce` -> 'all_reduce')."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""

def is_mode_sentinel(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None or node.value == -1
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
        isinstance(node.operand, ast.Constant) and node.operand.value == 1


def spawn_index_names(script) -> dict[str, int]:
    """The first parameter of an mp.spawn worker of `script` (a ddpkit.lint.analysis.Script) is the process index
    mp.spawn gives it, the local rank under whatever name (`def train(device_id, args)`): that name, where
    nothing else in the file binds it (no assignment, loop, `with ... as`, comprehension, or parameter of
    another function)."""
    defs = {n.name: n for n in script.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found: dict[str, int] = {}
    for call in script.calls:
        if not script.qualname(call.func).endswith(("multiprocessing.spawn", "start_processes")) or not call.args \
                or not isinstance(call.args[0], ast.Name) or call.args[0].id not in defs:
            continue
        worker = defs[call.args[0].id]
        params = [*worker.args.posonlyargs, *worker.args.args]
        if params and not rank_name_kind(params[0].arg):
            found[params[0].arg] = LOCAL
    if not found:
        return found
    bound: set[str] = set(script._bindings)
    for node in script.nodes:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bound |= {n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.arguments):
            owner = script.parents.get(id(node))
            if not (isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) and found.keys() & {
                    a.arg for a in (*node.posonlyargs, *node.args)[:1]} and any(
                    script.qualname(c.func).endswith(("multiprocessing.spawn", "start_processes")) and c.args
                    and isinstance(c.args[0], ast.Name) and c.args[0].id == owner.name for c in script.calls)):
                bound |= {a.arg for a in (*node.posonlyargs, *node.args, *node.kwonlyargs)}
    return {k: v for k, v in found.items() if k not in bound}


def find_rank_helpers(script) -> dict[str, int]:
    """Functions of `script` every one of whose non-constant returns depends on the rank (`return get_rank() == 0`,
    `return is_main_process()`); `return False` on a path without a process group does not count against.
    A name defined twice counts only where every definition is such a helper."""
    found: dict[str, int] = {}
    refused: set[str] = set()
    for d in script.nodes:
        if not isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        asked = [r.value for r in own_returns(d) if r.value is not None and not isinstance(r.value, ast.Constant)]
        kinds = [script.kind(v) for v in asked]
        if not kinds or not all(kinds) or not all(isinstance(v, _ANSWERS) for v in asked):
            refused.add(d.name)
            continue
        found[d.name] = min(found.get(d.name, GLOBAL), min(kinds))
    return {k: v for k, v in found.items() if k not in refused}


_ANSWERS = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Call, ast.Name, ast.Attribute)
"""What a rank helper returns: a test or the rank itself, not arithmetic on it (`return self.rank * x`)."""


def own_returns(d: ast.AST) -> list[ast.Return]:
    """The return statements of a function itself, not of the functions or lambdas nested in it."""
    found: list[ast.Return] = []
    todo = list(ast.iter_child_nodes(d))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return found

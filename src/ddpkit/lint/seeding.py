"""The DDP014 check: how the random number generators of the ranks are seeded (not at all, or all alike)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, terminal
from ddpkit.lint.rules import Hit, argument, check

__all__ = ["rank_seeds"]

_SEEDS = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_everything", "set_seed", "set_random_seed"})
_TORCH_SEEDS = ("torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.random.manual_seed")
_SEED_FIX = ("seed each rank differently and reproducibly: torch.manual_seed(args.seed + rank) "
             "(ddpkit.init(seed=...) does it for you)")


def _is_seed(s: Script, call: ast.Call) -> bool:
    name = s.qualname(call.func)
    if name.startswith(("torch.", "numpy.", "np.", "random.")) \
            or terminal(call.func) in ("seed_everything", "set_seed"):
        return terminal(call.func) in _SEEDS
    return s.qualname(call.func).startswith("ddpkit.init") and any(k.arg == "seed" for k in call.keywords)


def _reached(s: Script, call: ast.Call) -> bool:
    """The seed call runs: it is at module level or in a function the project calls."""
    return s.project.runs(s, call)


def _parameter_of(s: Script, call: ast.Call, value: ast.AST) -> tuple[str, int] | None:
    """(function, position) when `value` is a parameter of the function the call is in."""
    if not isinstance(value, ast.Name) or not s.context(call).functions:
        return None
    scope = s.context(call).scope
    d = next((d for d in s.defs if id(d) == scope), None)
    names = [a.arg for a in d.args.args] if d is not None else []
    return (d.name, names.index(value.id)) if value.id in names else None


_DRAWS = frozenset({"randint", "random", "getrandbits", "randrange", "integers", "initial_seed"})
_LIBRARIES = (("numpy.", "np."), ("random.",), ("torch.",))


def _drawn_per_rank(s: Script, value: ast.AST) -> bool:
    """`torch.manual_seed(np.random.randint(1 << 31))`: a seed drawn from another generator differs per rank
    unless that generator is seeded alike on every rank."""
    if not (isinstance(value, ast.Call) and terminal(value.func) in _DRAWS):
        return False
    library = next((prefixes for prefixes in _LIBRARIES if s.qualname(value.func).startswith(prefixes)), None)
    if library is None:
        return False
    sources = [(x, c) for x, c in s.project.calls_named(*_SEEDS) if _is_seed(x, c)
               and x.qualname(c.func).startswith(library) and value not in ast.walk(c)]
    return not sources or any(_differs_per_rank(x, c) for x, c in sources)


def _seeded_outside(s: Script) -> bool:
    """A call of a seeding helper the linted files do not define (`init_seeds(2 + rank)` from a module not
    given): what it seeds is not visible, so "nothing seeds" would be a guess."""
    project = s.project
    for x in project.scripts.values():
        for c in x.calls:
            plain = isinstance(c.func, ast.Name) or (isinstance(c.func, ast.Attribute) and isinstance(
                c.func.value, ast.Name) and c.func.value.id in x.aliases)
            if plain and "seed" in terminal(c.func).lower() and not _is_seed(x, c) \
                    and project.resolve(x, c.func) is None and terminal(c.func) not in x.function_names \
                    and project.runs(x, c):
                return True
    return False


_RANDOM_USERS = frozenset({"DistributedDataParallel", "DDP", "DataLoader", "FullyShardedDataParallel", "FSDP",
                           "randperm", "rand", "randn", "randint", "dropout", "shuffle", "choice", "sample"})


def _uses_randomness(project) -> bool:
    """Something in the program draws from a generator: a model is built or wrapped (weight initialisation,
    dropout), data is loaded (shuffling, augmentation) or numbers are drawn. A program that only joins the
    process group and prints has nothing to seed."""
    if project.augments:
        return True
    for x in project.scripts.values():
        if any(isinstance(n, ast.ClassDef) and n.bases for n in x.nodes):
            return True
        for c in x.calls:
            name = x.qualname(c.func)
            if terminal(c.func) in _RANDOM_USERS or name.startswith(("torch.nn.", "torchvision.", "timm.")) \
                    or "random" in name:
                return True
    return False


def _differs_per_rank(s: Script, call: ast.Call) -> bool:
    value = argument(call, "seed", 0)
    if value is None or s.kind(value) or _drawn_per_rank(s, value):
        return True
    param = _parameter_of(s, call, value)
    if param is None:
        return False
    callers = s.project.calls_named(param[0])
    return not callers or any(script.kind(given) for script, c in callers
                              for given in [argument(c, value.id, param[1])] if given is not None)


@check
def rank_seeds(s: Script) -> Iterator[Hit]:
    project = s.project
    if not project.distributed:
        return
    seeds = project.memo("seeds", lambda: [(script, c) for script, c in project.calls_named(*_SEEDS, "init")
                                            if _is_seed(script, c) and _reached(script, c)])
    if not seeds:
        if project.memo("seeded outside", lambda: _seeded_outside(s)) \
                or not project.memo("uses randomness", lambda: _uses_randomness(project)):
            return
        inits = [(x, c) for x, c in project.calls_named("init_process_group") if project.runs(x, c)]
        if inits and inits[0][0] is s:
            yield Hit(inits[0][1], "DDP014", "note",
                      "nothing seeds the random number generators: model initialisation, augmentation and "
                      "dropout differ from run to run, so no run can be repeated", _SEED_FIX)
        return
    torch_seeds = [(script, c) for script, c in seeds if script.qualname(c.func) in _TORCH_SEEDS]
    cuda_only = [(script, c) for script, c in torch_seeds if script.qualname(c.func).startswith("torch.cuda.")]
    if cuda_only and len(cuda_only) == len(torch_seeds) and not any(
            script.qualname(c.func) not in _TORCH_SEEDS and terminal(c.func) in ("seed_everything", "set_seed", "init")
            for script, c in seeds):
        script, call = cuda_only[0]
        if script is s:
            yield Hit(call, "DDP014", "note",
                      f"only the CUDA generator is seeded ({ast.unparse(call.func)}): the CPU generator, which "
                      "initialises the model's weights and draws augmentation and dropout on the CPU, stays unseeded",
                      "seed every generator: torch.manual_seed(seed + rank) (it seeds CUDA too)")
        return
    in_ranks = [(script, c) for script, c in torch_seeds if script.per_rank(c)]
    reported: set[int] = set()
    for script, call in torch_seeds:
        scope = script.context(call).scope
        if script is not s or scope in reported:
            continue
        if not in_ranks:
            reported.add(scope)
            yield Hit(call, "DDP014", "note",
                      "the seed is set in the parent process only: the ranks mp.spawn starts are fresh "
                      "interpreters and begin unseeded", "seed inside the worker function, from its rank: "
                      "torch.manual_seed(seed + rank)")
        elif script.per_rank(call) and project.augments and not _differs_per_rank(script, call):
            reported.add(scope)
            yield Hit(call, "DDP014", "warning",
                      "every rank gets the same seed, so every rank (and its DataLoader workers) draws the same "
                      "random augmentation stream: the ranks see differently indexed but identically "
                      "transformed data", _SEED_FIX)

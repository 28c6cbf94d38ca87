"""The DDP014 check: how the ranks' random number generators are seeded (alike, in the parent only, CUDA only)."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, argument, keyword, rerun_by_workers, terminal
from ddpkit.lint.rules import Hit, check

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


def _enclosing(s: Script, call: ast.Call) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if not s.context(call).functions:
        return None
    scope = s.context(call).scope
    return next((d for d in s.defs if id(d) == scope), None)


def _built_from(d: ast.AST, value: ast.AST) -> tuple[set[str], list[ast.AST]]:
    """The names a seed value is built from inside its function, followed through the function's own
    assignments (`seed = hash(args) % (1 << 31)`), with the expressions assigned on the way."""
    def plain(expr: ast.AST) -> set[str]:
        # `args.seed` is a setting of an object, not the object: the object being a parameter says nothing
        bases = {id(n.value) for n in ast.walk(expr) if isinstance(n, ast.Attribute)}
        return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and id(n) not in bases}

    names = plain(value)
    exprs: list[ast.AST] = [value]
    assigned = [(t.id, n.value) for n in ast.walk(d) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)] + [(n.target.id, n.value) for n in ast.walk(d)
                                               if isinstance(n, (ast.AugAssign, ast.AnnAssign))
                                               and isinstance(n.target, ast.Name) and n.value is not None]
    for _ in range(3):
        more = [(k, v) for k, v in assigned if k in names and not any(v is e for e in exprs)]
        if not more:
            break
        for _, v in more:
            exprs.append(v)
            names |= plain(v)
    return names, exprs


def _mentions_rank(s: Script, expr: ast.AST) -> bool:
    return any(s.kind(n) for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute, ast.Call)))


def _chosen_at(s: Script, call: ast.Call) -> list[tuple[Script, ast.Call]]:
    """Where the seed of a seed call is chosen: the calls of its helper that pass the value it is built from
    (`set_seed(cfg.seed)`, where the fix goes: `set_seed(cfg.seed + rank)`), or the seed call itself."""
    d = _enclosing(s, call)
    value = argument(call, "seed", 0)
    if d is None or value is None:
        return [(s, call)]
    names, _ = _built_from(d, value)
    positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
    if not any(n in names for n in positional + [a.arg for a in d.args.kwonlyargs]) and (
            d.args.vararg is None or d.args.vararg.arg not in names):
        return [(s, call)]  # a seed of the helper's own (`torch.manual_seed(0)`): chosen where it is called
    return _callers(s, d) or [(s, call)]


def _callers(s: Script, d: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[Script, ast.Call]]:
    """The live calls of the function `d` of `s`: in its own file, or imported from it, also under another name
    (`from lib import debug_visual_only as debug_flow`), not a library's function of the same name
    (`transformers.set_seed`)."""
    names = {d.name} | {local for x in s.project.scripts.values() for local, full in x.aliases.items()
                        if full.rsplit(".", 1)[-1] == d.name}
    return [(x, c) for x, c in s.project.calls_named(*names) if x.project.runs(x, c) and (
        x.local_callee(c) == d.name and x is s or (s.project.resolve(x, c.func) or ("", ""))[0] == s.path)]


_RATE = re.compile(r"(attn_|attention_|hidden_|residual_|embed_|emb_|ff_)?drop(out)?(_path)?(_rate|_prob|_p)?")
"""Keywords that give a model the rate of its dropout (`dropout=0.1`, `attention_dropout=0.2`,
`drop_path_rate=0.4`): the model it builds draws masks in every training forward unless the rate is 0."""
_TRANSFORMERS_DROPOUT = re.compile(r"(Bert|Roberta|XLMRoberta|Albert|DistilBert|Electra|GPT2|T5|MT5|Bart|MBart|"
                                   r"Marian|Pegasus|Camembert|Deberta|DebertaV2|XLNet|ViT)(\w*Model|For[A-Z]\w*)")
"""Model classes of the transformers architectures whose pretrained configs default to dropout 0.1
(hidden_dropout_prob, dropout_rate, resid_pdrop): `BertForMultipleChoice.from_pretrained(...)` draws dropout masks
when trained. Not their tokenizers or configs."""


def _positive(value: ast.AST | None) -> bool:
    """A number (or the text of one: an option's string default) above 0."""
    if not isinstance(value, ast.Constant) or isinstance(value.value, bool):
        return False
    try:
        return float(value.value) > 0
    except (TypeError, ValueError):
        return False


def _setting_default(project, name: str) -> ast.AST | None:
    """The default of the one setting called `name` the program declares: a command-line option
    (`add_argument("--drop", default=0.2)`) or a field of a config class (`ATT_DROPOUT = 0.1`); None where it
    declares none, or several."""
    declared = []
    for x in project.scripts.values():
        for c in x.calls:
            flags = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            dest = keyword(c, "dest")
            named = dest.value if isinstance(dest, ast.Constant) else next(
                (f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")), "")
            if terminal(c.func) == "add_argument" and named == name:
                declared.append(keyword(c, "default"))
        declared += [item.value for c in x.nodes if isinstance(c, ast.ClassDef) for item in c.body
                     if isinstance(item, (ast.Assign, ast.AnnAssign)) and item.value is not None
                     and any(isinstance(t, ast.Name) and t.id == name
                             for t in (item.targets if isinstance(item, ast.Assign) else [item.target]))]
    return declared[0] if len(declared) == 1 else None


def _nonzero(project, rate: ast.AST | None) -> bool:
    """A rate surely above 0: a positive number, or a setting whose only default is one (`float(args.drop)` with
    `--drop` defaulting to "0.2"). A setting the linted files do not declare may be 0: not sure."""
    if isinstance(rate, ast.Call) and terminal(rate.func) == "float" and len(rate.args) == 1:
        rate = rate.args[0]
    if isinstance(rate, (ast.Attribute, ast.Name)):
        rate = _setting_default(project, terminal(rate))
    return _positive(rate)


def _dropout(project) -> tuple[Script, ast.Call] | None:
    """The first dropout layer or call the program builds with a rate that is not 0 (`nn.Dropout(0.3)`,
    `nn.Dropout()`, `F.dropout(x, 0.1)`), a model built with a rate surely above 0 (`Transformer(attention_dropout=0.2)`,
    `Seq2Seq(..., dropout=float(args.drop))` where `--drop` defaults to 0.2) or a pretrained BERT-family model: a
    draw per element of every training forward."""
    for x in project.scripts.values():
        for c in x.calls:
            name = x.qualname(c.func)
            if name.startswith("torch.") and re.fullmatch(r"(Alpha|FeatureAlpha)?Dropout([123]d)?|dropout",
                                                          terminal(c.func)):
                rate = argument(c, "p", 1 if terminal(c.func) == "dropout" else 0)
                drawn = rate is None or isinstance(rate, ast.Constant) and isinstance(rate.value, float) \
                    and rate.value > 0
            elif terminal(c.func) == "from_pretrained" and isinstance(c.func, ast.Attribute):
                # the class names the architecture, from transformers or a copy of its modelling code
                classes = _classes_held(x, c.func.value)
                drawn = bool(classes) and all(_TRANSFORMERS_DROPOUT.fullmatch(name) for name in classes)
            elif (built := _TRANSFORMERS_DROPOUT.fullmatch(terminal(c.func))) and (c.args or c.keywords):
                drawn = _default_rates(x, argument(c, "config", 0), built[1])
            else:
                drawn = any(k.arg and _RATE.fullmatch(k.arg) and _nonzero(project, k.value) for k in c.keywords)
            if drawn and project.runs(x, c):
                return x, c
    return None


def _default_rates(s: Script, config: ast.AST | None, architecture: str) -> bool:
    """A model config built in the function with its architecture's default dropout: the variable a model class is
    built from (`GPT2LMHeadModel(cfg)`) holds only `GPT2Config(vocab_size=...)`, the config of the same architecture,
    which names no rate (`*_pdrop`, `hidden_dropout_prob`) and unpacks nothing (`**settings` may set them to 0)."""
    if not isinstance(config, ast.Name):
        return False
    assigned = s.local_assignments(config.id, config)
    return bool(assigned) and all(
        isinstance(v, ast.Call) and terminal(v.func) == f"{architecture}Config" and not v.args
        and all(k.arg and "drop" not in k.arg for k in v.keywords) for _, v in assigned)


def _classes_held(s: Script, expr: ast.AST) -> list[str]:
    """The names of the classes an expression is: `BertModel` itself, or each class its function assigns to the
    variable it reads (`model_cls = BertForMaskedLM` in one branch, `RobertaForMaskedLM` in the other)."""
    if isinstance(expr, ast.Name):
        assigned = s.local_assignments(expr.id, expr)
        if assigned and all(isinstance(v, (ast.Name, ast.Attribute)) for _, v in assigned):
            return [terminal(v) for _, v in assigned]
    return [terminal(expr)]


def _given_per_rank(s: Script, d: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> bool | None:
    """Whether some caller of `d` passes a rank-dependent value for a parameter the seed is built from: by
    position or keyword, or among the extra positional arguments `*args` collects (`set_random_seed(seed,
    dist.get_rank())`). None when the seed depends on no parameter."""
    positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
    params = [n for n in positional + [a.arg for a in d.args.kwonlyargs] if n in names]
    rest = d.args.vararg.arg if d.args.vararg is not None and d.args.vararg.arg in names else None
    if not params and rest is None:
        return None
    callers = _callers(s, d)
    if not callers:
        return True
    for script, c in callers:
        for name in params:
            given = argument(c, name, positional.index(name) if name in positional else len(c.args))
            if given is not None and _mentions_rank(script, given):
                return True
        if rest is not None and any(_mentions_rank(script, a) for a in c.args[len(positional):]):
            return True
    return False


_DRAWS = frozenset({"randint", "random", "getrandbits", "randrange", "integers", "initial_seed"})
_LIBRARIES = (("numpy.", "np."), ("random.",), ("torch.",))


def _drawn_per_rank(s: Script, value: ast.AST, seen: frozenset[int] = frozenset()) -> bool:
    """`torch.manual_seed(np.random.randint(1 << 31))`: a seed drawn from another generator differs per rank
    unless that generator is seeded alike on every rank. `seen`: the seed calls already followed; a seed drawn from
    the generator it then seeds (`s = random.randint(...); random.seed(s)`) is drawn before any seed, per rank."""
    if not (isinstance(value, ast.Call) and terminal(value.func) in _DRAWS):
        return False
    library = next((prefixes for prefixes in _LIBRARIES if s.qualname(value.func).startswith(prefixes)), None)
    if library is None:
        return False
    sources = [(x, c) for x, c in s.project.calls_named(*_SEEDS) if _is_seed(x, c)
               and x.qualname(c.func).startswith(library) and value not in ast.walk(c) and id(c) not in seen]
    return not sources or any(_differs_per_rank(x, c, seen) for x, c in sources)


def _differs_per_rank(s: Script, call: ast.Call, seen: frozenset[int] = frozenset()) -> bool:
    seen = seen | {id(call)}
    value = argument(call, "seed", 0)
    if value is None or s.kind(value) or _drawn_per_rank(s, value, seen):
        return True
    d = _enclosing(s, call)
    if d is None:
        return False
    names, exprs = _built_from(d, value)
    if any(_mentions_rank(s, e) or _drawn_per_rank(s, e, seen) for e in exprs):
        return True  # `seed = base + rank` (or drawn from a generator seeded per rank) in the helper itself
    return bool(_given_per_rank(s, d, names))


@check
def rank_seeds(s: Script) -> Iterator[Hit]:
    project = s.project
    if not project.distributed:
        return
    seeds = project.memo("seeds", lambda: [(script, c) for script, c in project.calls_named(*_SEEDS, "init")
                                            if _is_seed(script, c) and _reached(script, c)])
    if not seeds:
        # no seed at all is a matter of repeating a run, not a difference between the ranks (unseeded generators
        # already differ per rank, and DDP broadcasts rank 0's initial weights), and the randomness that matters
        # may be seeded where the linter cannot see (a framework, a library's trainer, a file not linted): silent
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
    in_ranks = [(script, c) for script, c in torch_seeds if script.per_rank(c) or rerun_by_workers(script, c)]
    if not in_ranks:
        # a seed only the mp.spawn parent sets: the spawned workers are fresh interpreters that do not inherit its
        # generators, so the program does not seed the ranks alike (nor at all: a matter of repeating a run)
        return
    dropout = None if project.augments else project.memo("dropout", lambda: _dropout(project))
    if not (project.augments or dropout):
        return
    if project.memo("reseeded per rank", lambda: any(
            terminal(c.func) != "seed" and script.per_rank(c) and _differs_per_rank(script, c) for script, c in seeds)):
        # the ranks' torch generators are also seeded apart (`seed_everything(rank_seed(seed, rank))` before the
        # training loop, as `ddpkit port` writes): which seed the training draws follow is not sure from here
        return
    sites = project.memo("seeds chosen alike", lambda: _chosen_alike(torch_seeds))
    training = [(x, site) for x, site in sites if _reaches_backward(x, site)]
    # `set_seed(0)` and `torch.manual_seed(0)` in one function: one choice of the seed, the one in effect
    groups: dict[tuple[str, int], list[tuple[Script, ast.Call]]] = {}
    for x, site in sites:
        groups.setdefault((x.path, x.context(site).scope), []).append((x, site))
    for group in groups.values():
        x, site = _in_effect(group)
        if x is not s:
            continue
        if training and (x, site) not in training:
            continue  # a seed of a path that trains nothing (a preview, an export) beside the one that trains
        if project.augments:
            yield Hit(site, "DDP014", "warning",
                      "every rank gets the same seed, so every rank (and its DataLoader workers) draws the same "
                      "random augmentation stream: the ranks see differently indexed but identically "
                      "transformed data", _SEED_FIX)
        elif dropout is not None:
            where, layer = dropout
            yield Hit(site, "DDP014", "note",
                      f"every rank gets the same seed, so the dropout masks ({ast.unparse(layer.func)} at "
                      f"{os.path.basename(where.path)}:{layer.lineno}) of a step are the same on every rank: the "
                      "ranks' gradients are less independent than intended (milder than identical augmentation)",
                      _SEED_FIX)


def _reaches_backward(s: Script, site: ast.Call, depth: int = 3) -> bool:
    """The function a seed is chosen in runs a backward(), itself or through the project functions it calls by name
    (`depth` calls deep); module code counts as training."""
    d = _enclosing(s, site)
    if d is None:
        return True
    todo, seen = [(d, depth)], set()
    while todo:
        func, left = todo.pop()
        if id(func) in seen:
            continue
        seen.add(id(func))
        calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
        if any(terminal(c.func) == "backward" for c in calls):
            return True
        if left:
            names = {terminal(c.func) for c in calls}
            todo += [(f, left - 1) for x in s.project.scripts.values() for f in x.defs if f.name in names]
    return False


def _chosen_alike(torch_seeds: list[tuple[Script, ast.Call]]) -> list[tuple[Script, ast.Call]]:
    """Where a seed the same on every rank is chosen (see _chosen_at), for the torch seeds the ranks run, by line."""
    sites: list[tuple[Script, ast.Call]] = []
    for script, call in torch_seeds:
        if (script.per_rank(call) or rerun_by_workers(script, call)) and not _differs_per_rank(script, call):
            sites += [site for site in _chosen_at(script, call) if site not in sites]
    return sorted(sites, key=lambda x: (x[0].path, x[1].lineno, x[1].col_offset))


def _in_effect(group: list[tuple[Script, ast.Call]]) -> tuple[Script, ast.Call]:
    """Of the places one function seeds alike (by line), the one the training draws follow: a later seeding before
    the function's first loop after them overrides the earlier (`torch.manual_seed(seed + 1)` ... building the
    datasets ... `torch.manual_seed(seed)`); one inside or after that loop is a later phase's."""
    x, first = group[0]
    scope = _enclosing(x, first)
    body = [scope] if scope is not None else [n for n in x.tree.body
                                              if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    loops = [n.lineno for part in body for n in ast.walk(part)
             if isinstance(n, (ast.For, ast.While)) and n.lineno > first.lineno]
    stop = min(loops, default=None)
    before = [(y, site) for y, site in group if stop is None or site.lineno < stop]
    # `torch.manual_seed(s)` then `torch.cuda.manual_seed_all(s)`: the first seeds CUDA too, the second repeats it
    cpu = [(y, site) for y, site in before if not y.qualname(site.func).startswith("torch.cuda.")]
    return (cpu or before)[-1]

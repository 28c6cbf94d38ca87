"""The last edits of `ddpkit port`: `with ddpkit.init() as ctx:` around the entry point, ctx passed down, the import."""

from __future__ import annotations

import libcst as cst

from ddpkit.port.facts import ENTRY, Facts, dotted, statements_of, walk

__all__ = ["add_import", "free_ctx", "open_context", "thread_ctx"]


def _scope_nodes(module: cst.Module) -> dict[str, cst.FunctionDef]:
    found: dict[str, cst.FunctionDef] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            found[stmt.name.value] = stmt
        elif isinstance(stmt, cst.ClassDef):
            for item in statements_of(stmt):
                if isinstance(item, cst.FunctionDef):
                    found[f"{stmt.name.value}.{item.name.value}"] = item
    return found


def _uses_ctx(func: cst.FunctionDef) -> bool:
    params = {p.name.value for p in (*func.params.params, *func.params.kwonly_params)}
    return "ctx" not in params and any(isinstance(n, cst.Name) and n.value == "ctx"
                                       for n in walk(func.body, into_functions=True))


class _Threader(cst.CSTTransformer):
    """Adds a keyword-only `ctx` parameter to the functions that need it and `ctx=ctx` to their calls."""

    def __init__(self, facts: Facts, needs: set[str], callers: set[str]) -> None:
        super().__init__()
        self.facts, self.needs, self.callers = facts, needs, callers
        self.keys: list[str] = []
        self.cls: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.cls.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.cls.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        key = f"{self.cls[-1]}.{node.name.value}" if self.cls and not self.keys else node.name.value
        self.keys.append(key if not self.keys else self.keys[-1])

    def leave_FunctionDef(self, original, updated: cst.FunctionDef):
        key = self.keys.pop()
        if self.keys or key not in self.needs or original is not _scope_nodes_cache(self, key):
            return updated
        params = updated.params
        ctx = cst.Param(cst.Name("ctx"))
        star = params.star_arg if isinstance(params.star_arg, (cst.Param, cst.ParamStar)) else cst.ParamStar()
        regular = list(params.params)
        if regular and not isinstance(star, cst.Param):  # `def f(a, b, *, ctx)`
            regular[-1] = regular[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(params=params.with_changes(
            params=regular, star_arg=star, kwonly_params=[*params.kwonly_params, ctx]))

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        caller = self.keys[0] if self.keys else ENTRY
        if caller not in self.callers or any(a.keyword and a.keyword.value == "ctx" for a in updated.args):
            return updated
        if not set(self.facts.callees(updated, caller)) & self.needs:
            return updated
        args = list(updated.args)
        if args and not isinstance(args[-1].comma, cst.Comma):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        return updated.with_changes(args=[*args, cst.Arg(cst.Name("ctx"), keyword=cst.Name("ctx"), equal=equal)])


def _scope_nodes_cache(threader: _Threader, key: str):
    return threader.nodes.get(key)


def thread_ctx(module: cst.Module, facts: Facts) -> cst.Module:
    """Functions below the entry point that now use ctx get `*, ctx`; their callers pass `ctx=ctx`."""
    if facts.ctx_global:
        return module
    nodes = _scope_nodes(module)
    candidates = facts.ported - {facts.entry_key, ENTRY}
    needs = {k for k in candidates if k in nodes and _uses_ctx(nodes[k])}
    while True:
        more = {k for k in candidates - needs if facts.scopes[k].calls & needs}
        if not more:
            break
        needs |= more
    if not needs:
        return module
    threader = _Threader(facts, needs, needs | {facts.entry_key})
    threader.nodes = nodes
    return module.visit(threader)


def _init_call(seed: cst.BaseExpression | None, device: str | None = None) -> cst.Call:
    """`ddpkit.init(seed=..., device="auto" if args.cuda else "cpu")`: the script's seed and its device (`device` is
    the expression given to device=: a GPU switch's, or `"cpu"`)."""
    equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    args = [] if seed is None else [cst.Arg(seed, keyword=cst.Name("seed"), equal=equal)]
    if device is not None:
        if args:
            args[0] = args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(cst.parse_expression(device), keyword=cst.Name("device"),
                            equal=equal))
    return cst.Call(cst.parse_expression("ddpkit.init"), args=args)


class _BlankLines(cst.CSTTransformer):
    """Blank lines moved under the `with` stay empty (no indentation whitespace on them)."""

    def leave_EmptyLine(self, original: cst.EmptyLine, updated: cst.EmptyLine) -> cst.EmptyLine:
        if updated.comment is None:
            return updated.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))
        return updated


_CAPTURE = "rng_before_init = ddpkit.rng.rng_state()  # the script seeded itself above: keep its streams\n"
_RESTORE = ("ddpkit.rng.set_rng_state(rng_before_init)  # every rank draws what the original drew until training "
            "(ddpkit.init seeded each rank differently)\n")


_ALIKE = ("ddpkit.rng.seed_everything(ctx.seed)  # one seed on every rank until training: data shuffled or split "
          "before it agrees\n")


def _first(keep_rng: bool) -> cst.BaseStatement:
    """The statement right after ddpkit.init: the script's own streams restored, or one seed for every rank.

    Either way nothing drawn before training (a shuffle in the script's own modules, `df.sample(frac=1)`) differs
    between ranks; ddpkit.loader then seeds each batch per rank, and a step that draws its own batches gets a
    per-rank reseed before its loop."""
    return cst.parse_statement(_RESTORE if keep_rng else _ALIKE)


def _with(body: list[cst.BaseStatement], seed: cst.BaseExpression | None, device: str | None = None,
          keep_rng: bool = False) -> cst.With:
    lines = list(body[0].leading_lines) if body else []
    blank = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    leading = lines[:blank]  # comments stay with the line they describe
    body = [stmt.visit(_BlankLines()) for stmt in body]
    if body:
        body = [body[0].with_changes(leading_lines=[line.with_changes(indent=True) for line in lines[blank:]]),
                *body[1:]]
    body = [_first(keep_rng), *body]  # first in the block: nothing may draw between ddpkit.init and it
    return cst.With(items=[cst.WithItem(_init_call(seed, device), asname=cst.AsName(cst.Name("ctx")))],
                    body=cst.IndentedBlock(body), leading_lines=leading)


def open_context(module: cst.Module, facts: Facts, seed: cst.BaseExpression | None,
                 device: str | None = None) -> cst.Module:
    """Put the entry point's region (everything after argument parsing) in `with ddpkit.init() as ctx:`.

    A script that seeds itself before that point (`set_seed(1)` at module level) keeps its generators: their
    state is captured before ddpkit.init and restored after it, so every rank draws alike until training."""
    keep_rng = facts.seeded_before_init()
    owner = facts.entry_owner
    keep = len(statements_of(owner)) - len(facts.region)
    if not facts.ctx_global:
        name = facts.entry_key
        new_body = list(_scope_nodes(module)[name].body.body)
        # `def train(device="cuda:0")`: the parameter's default would send every rank to one device
        bound = [cst.parse_statement(f"{p.name.value} = ctx.device\n") for p in (
            *facts.scopes[name].node.params.params, *facts.scopes[name].node.params.kwonly_params)
            if p.default is not None and "device" in p.name.value.lower()]
        wrapped = [*new_body[:keep], *([cst.parse_statement(_CAPTURE)] if keep_rng else []),
                   _with([*bound, *new_body[keep:]] if bound else new_body[keep:], seed, device, keep_rng)]
        target = _scope_nodes(module)[name]
        return module.deep_replace(target, target.with_changes(body=target.body.with_changes(body=wrapped)))
    if isinstance(owner, cst.Module):
        body = list(module.body)
        return module.with_changes(body=_flat(body, keep, seed, device, keep_rng))
    guard = next(s for s in module.body if isinstance(s, cst.If) and module.code_for_node(s.test)
                 == facts.code(owner.test))
    inner = list(guard.body.body)
    return module.deep_replace(guard, guard.with_changes(body=guard.body.with_changes(
        body=_flat(inner, keep, seed, device, keep_rng))))


def _flat(body: list[cst.BaseStatement], keep: int, seed: cst.BaseExpression | None,
          device: str | None = None, keep_rng: bool = False) -> list[cst.BaseStatement]:
    """Top-level code keeps its indentation: `ctx = ddpkit.init()` before the region, `ctx.close()` after it.

    An exception ends the process without close(): the launcher then stops the other ranks."""
    start = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name("ctx"))], _init_call(seed, device))])
    if keep < len(body):
        lines = list(body[keep].leading_lines)
        blank = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
        start = start.with_changes(leading_lines=lines[:blank])  # comments stay with the line they describe
        body = [*body[:keep], body[keep].with_changes(leading_lines=lines[blank:]), *body[keep + 1:]]
    close = cst.parse_statement("ctx.close()  # every rank leaves the process group together\n")
    if keep_rng:
        capture = cst.parse_statement(_CAPTURE).with_changes(leading_lines=start.leading_lines)
        return [*body[:keep], capture, start.with_changes(leading_lines=[]), cst.parse_statement(_RESTORE),
                *body[keep:], close]
    return [*body[:keep], start, _first(False), *body[keep:], close]


def add_import(module: cst.Module, rng: bool = False, device: bool = False, collectives: bool = False) -> cst.Module:
    """`import ddpkit` after the script's leading imports (and `import ddpkit.rng` when the port reads the
    generators before ddpkit.init, which is what imports that module otherwise; `import ddpkit.device` when the
    port moves batches with ddpkit.device.to_device, a name ddpkit's face does not carry; `import
    ddpkit.collectives` when it sums a number with ddpkit.collectives.all_reduce_number, likewise)."""
    body = list(module.body)
    last = -1
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                              for s in stmt.body):
            last = i
        elif isinstance(stmt, cst.SimpleStatementLine) and i == 0 and isinstance(stmt.body[0], cst.Expr):
            continue
        else:
            break
    body.insert(last + 1, cst.parse_statement("import ddpkit\n"))
    if rng:
        body.insert(last + 2, cst.parse_statement("import ddpkit.rng\n"))
    if device:
        body.insert(last + 2 + rng, cst.parse_statement("import ddpkit.device\n"))
    if collectives:
        body.insert(last + 2 + rng + device, cst.parse_statement("import ddpkit.collectives\n"))
    return module.with_changes(body=body)


class _OwnCtx(cst.CSTTransformer):
    """Renames the script's own `ctx` (a variable, a parameter, a function) to `name`: attributes (`x.ctx`), imported
    names and keywords of calls into code the port does not rewrite keep their spelling."""

    def __init__(self, name: str, local: set[str]) -> None:
        super().__init__()
        self.name, self.local = name, local

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.name) if original.value == "ctx" else updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        return updated.with_changes(module=original.module)

    def leave_ImportAlias(self, original: cst.ImportAlias, updated: cst.ImportAlias) -> cst.ImportAlias:
        if isinstance(original.name, cst.Name) and original.name.value == "ctx" and original.asname is None:
            return updated.with_changes(name=original.name, asname=cst.AsName(cst.Name(self.name)))
        return updated.with_changes(name=original.name)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        func = original.func.attr.value if isinstance(original.func, cst.Attribute) else dotted(original.func)
        if func in self.local:  # `f(ctx=ctx)` of a function of this file, whose parameter is renamed too
            return updated
        return updated.with_changes(args=[u.with_changes(keyword=o.keyword) if o.keyword is not None else u
                                          for o, u in zip(original.args, updated.args)])


def free_ctx(module: cst.Module) -> tuple[cst.Module, str | None]:
    """The script with its own name `ctx` renamed where it uses one (`ctx = torch.autocast(...)`, `def f(ctx):`), so
    the context the port adds under that name never meets it; and the new name (None where nothing was renamed)."""
    names = {n.value for n in walk(module, into_functions=True) if isinstance(n, cst.Name)}
    attrs = {id(n.attr) for n in walk(module, into_functions=True) if isinstance(n, cst.Attribute)}
    keywords = {id(a.keyword) for n in walk(module, into_functions=True) if isinstance(n, cst.Call)
                for a in n.args if a.keyword is not None}
    if not any(isinstance(n, cst.Name) and n.value == "ctx" and id(n) not in attrs | keywords
               for n in walk(module, into_functions=True)):
        return module, None
    name, n = "script_ctx", 1
    while name in names:
        n += 1
        name = f"script_ctx{n}"
    local = {f.name.value for f in walk(module, into_functions=True) if isinstance(f, cst.FunctionDef) and any(
        p.name.value == "ctx" for p in (*f.params.posonly_params, *f.params.params, *f.params.kwonly_params))}
    return module.visit(_OwnCtx(name, local)), name

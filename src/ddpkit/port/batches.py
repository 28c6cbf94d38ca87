"""Batches a script draws itself in each step (no DataLoader): each rank draws `B // world_size`, or a TODO names B.

`ix = torch.randint(len(data) - block, (batch_size,))` in a char-LM's `get_batch()` draws a batch of `batch_size`
offsets from the process's random stream. After the port each rank draws from its own stream (ddpkit.init seeds
ranks differently), so with `batch_size` kept each rank would draw a whole batch: the global batch would be
world_size times the script's, and the learning rate and the tokens per step would no longer be the ones the script
was tuned with. As `batch_size=B // ctx.world_size` does for a loader, the draw's size is divided, which keeps the
global batch of B. That is only sound where B sizes nothing else the step computes (`x.view(B, -1)` would then
mismatch), so B read anywhere but in the draws leaves a TODO naming it, as does a size the port cannot read or a
literal first dimension of more (`torch.randn(8, 4)`: a batch of 8, or a shape; `torch.randint(64, (8,))` draws 8).
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk

__all__ = ["plan_drawn_batches"]


def plan_drawn_batches(plan: Any, draws: list[cst.Call]) -> None:
    """Divide the batch the step's random draws take by ctx.world_size (a note at the first), or leave a TODO
    naming it. Every rank then draws its own `B // world_size` samples: the global batch of B is kept."""
    sizes = [(call, *_batch_of(call)) for call in draws]
    shaped = [(call, size) for call, size, _ in sizes if size is not None and not _one(size)]
    flat = all(dims == 1 for _, size, dims in sizes if size is not None and not _one(size))
    texts = {_text(plan, size) for _, size in shaped}
    first = draws[0]
    where = plan.line_of(first)
    blocker = None
    if len(texts) != 1:
        blocker = ("the port cannot read how many samples it draws" if not texts else
                   "the draws take different sizes (" + ", ".join(f"`{t}`" for t in sorted(texts)) + ")")
    else:
        batch = next(iter(texts))
        reads = _other_reads(plan, batch, [c for c, _ in shaped])
        if isinstance(shaped[0][1], cst.Integer) and not flat:
            blocker = f"its first dimension is the literal `{batch}`, which may be a shape as well as a batch"
        elif reads:
            blocker = f"`{batch}` also sizes what the script computes at line {reads[0]}, which would then mismatch"
    if blocker is not None:
        what = f"`{' '.join(plan.f.code(first).split())}`"
        plan.todo(first, f"{what} draws a batch from this rank's own random stream (ddpkit.init seeds each rank "
                  "differently), so with its size kept the global batch is world_size times the script's (the "
                  f"learning rate and the samples per step change); the port did not divide it: {blocker}; draw "
                  "the batch divided by ctx.world_size on each rank to keep the original's global batch")
        return
    for _, size in shaped:
        plan.replace[id(size)] = f"{batch} // ctx.world_size"
    plan.note(first, f"each rank draws {batch} // world_size samples here from its own random stream: the global "
              f"batch of {batch} samples per step is kept")
    plan.summary.append(f"no DataLoader: each rank draws {batch} // world_size random samples per step (line "
                        f"{where}), the global batch of {batch} is kept")


def _batch_of(call: cst.Call) -> tuple[cst.BaseExpression | None, int]:
    """How many samples a draw takes: its size's first dimension (`(batch_size,)` of `torch.randint(n, (batch_size,
    ))`, `size=B` of `np.random.randint(0, n, size=B)`, `k` of `random.sample(range(n), k)`), None when unread; and
    how many dimensions the draw has (one: so many samples or indices; more: the first may be a batch or a shape)."""
    name = dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    size: cst.BaseExpression | None = None
    if name.startswith("torch."):
        if last == "randint":
            size = keywords.get("size", positional[-1] if len(positional) >= 2 else None)
        elif last in ("randn", "rand"):
            size = keywords.get("size", positional[0] if len(positional) == 1 else None)
            if len(positional) > 1:
                size = cst.Tuple([cst.Element(p) for p in positional])
    elif name.split(".")[0] in ("np", "numpy"):
        at = {"randint": 2, "choice": 1, "normal": 2, "uniform": 2}.get(last)
        if at is not None:
            size = keywords.get("size", positional[at] if len(positional) > at else None)
        elif last in ("rand", "randn") and positional:
            size = cst.Tuple([cst.Element(p) for p in positional])
    elif name == "random.sample":
        size = keywords.get("k", positional[1] if len(positional) > 1 else None)
    elif name == "random.choices":
        size = keywords.get("k")
    dims = 1
    if isinstance(size, (cst.Tuple, cst.List)):
        dims = len(size.elements)
        size = size.elements[0].value if size.elements else None
    return (size if isinstance(size, (cst.Name, cst.Attribute, cst.Subscript, cst.Integer)) else None), dims


def _one(size: cst.BaseExpression) -> bool:
    """A literal size below 2 (`torch.rand(1)`: one number, a coin flip, not a batch)."""
    return isinstance(size, cst.Integer) and int(size.value, 0) < 2


def _text(plan: Any, expr: cst.CSTNode) -> str:
    return " ".join(plan.f.code(expr).split())


def _other_reads(plan: Any, batch: str, draws: list[cst.Call]) -> list[int]:
    """Lines that read `batch` (a name, `args.batch_size`, `cfg["batch_size"]`) outside the draws and outside
    the targets of assignments."""
    inside = {id(n) for c in draws for n in walk(c)}
    # names that read nothing: `x.batch_size`'s attribute, `f(batch_size=...)`'s keyword, a parameter's name
    inside |= {id(n.attr) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Attribute)}
    inside |= {id(n.keyword) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Arg) and n.keyword}
    inside |= {id(n.name) for n in walk(plan.f.module, into_functions=True) if isinstance(
        n, (cst.Param, cst.FunctionDef, cst.ClassDef))}
    targets = {id(n) for a in walk(plan.f.module, into_functions=True) if isinstance(a, (cst.Assign, cst.AugAssign,
               cst.AnnAssign)) for t in (a.targets if isinstance(a, cst.Assign) else [a]) for n in walk(t.target)}
    lines = []
    for node in walk(plan.f.module, into_functions=True):
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)) and id(node) not in inside \
                and id(node) not in targets and _text(plan, node) == batch:
            lines.append(plan.line_of(node))
    return sorted(lines)

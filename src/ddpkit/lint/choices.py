"""The DDP006 check for a decision on one shard: a figure of this rank's shard picks the checkpoint kept."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import NONE, Script, terminal
from ddpkit.lint.flow import flows, sharded_names, summaries_of
from ddpkit.lint.reporting import shows
from ddpkit.lint.rules import Hit, check

__all__ = ["shard_figure_picks_checkpoint"]

_SAVES = re.compile(r"save", re.IGNORECASE)
"""Calls that write a checkpoint: torch.save, model.save_pretrained, save_checkpoint, a model's own .save()."""


@check
def shard_figure_picks_checkpoint(s: Script) -> Iterator[Hit]:
    """`if rank == 0: ... if val_loss < best: torch.save(...)` where val_loss is computed from this rank's batches of
    a sharded loader (followed by flow.py) and never reduced: rank 0's shard alone decides which model is kept as
    the best. Reported at the comparison, the line that must read a reduced figure."""
    project = s.project
    if not project.distributed or "torchmetrics" in s.aliases or not sharded_names(s):
        return
    summaries = summaries_of(s)
    scopes = {(id(f.node) if f.node is not s.tree else 0): f for f in flows(s) if f.tainted}
    for node in s.nodes:
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
            continue
        ctx = s.context(node)
        flow = scopes.get(ctx.scope)
        if flow is None or ctx.level == NONE or ctx.single:
            continue  # (every rank deciding on its own figure saves from each rank: DDP004's concern)
        save = next((c for stmt in node.body for c in ast.walk(stmt)
                     if isinstance(c, ast.Call) and _SAVES.search(terminal(c.func))), None)
        # (the running best the body overwrites, `best = val_loss`, is judged through the figure it copies)
        kept = {ast.unparse(t) for stmt in node.body for a in ast.walk(stmt) if isinstance(a, ast.Assign)
                for t in a.targets if isinstance(t, (ast.Name, ast.Attribute))}
        names = [n for n in flow.tainted_names(s, node.test, summaries) if n not in kept] if save is not None else []
        if not names or _shown_in_scope(s, ctx.scope, names[0]):
            continue  # (a figure the function also reports is one mistake, fixed by one reduction: reported there)
        yield Hit(node, "DDP006", "warning",
                  f"'{names[0]}' is computed from this rank's batches of a sharded loader and, inside a rank check, "
                  f"decides which checkpoint is kept (line {save.lineno}): rank 0's shard alone picks the best "
                  "model; the figure never goes through a collective",
                  "all-reduce the figure's sum and count on every rank before the comparison (dist.all_reduce(t, "
                  "op=dist.ReduceOp.SUM)), then compare the run's figure on rank 0")


def _shown_in_scope(s: Script, scope: int, name: str) -> bool:
    """A call of the same function (or module code) that shows or records the figure named `name`."""
    return any(s.context(c).scope == scope and shows(s, c) and any(
        isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) == name
        for a in (*c.args, *(k.value for k in c.keywords)) for n in ast.walk(a)) for c in s.calls)

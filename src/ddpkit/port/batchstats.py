"""BatchNorm heads of self-supervised models, whose batch statistics the port shrinks to one rank's share.

Under DDP each rank's BatchNorm normalises over its own batch_size // world_size samples (a global batch of 64 is 8
samples a rank on 8 GPUs). An ordinary classifier trained on labels barely notices, so the port leaves it alone. A
self-supervised model does: the BatchNorm1d of a projector or predictor MLP (BYOL, SimSiam, Barlow Twins) is part of
the objective, as the batch statistics are what keep its embeddings from collapsing. The policy: a model the port
wraps whose class (of this file or of a project module it imports, directly or through a class of that file it builds)
holds a BatchNorm1d, trained in a loop over a ported loader that drops the labels (`for (x1, x2), _ in loader`), is named in a TODO at its wrap, unless
the wrap already asks for `sync_batchnorm=True`. Read with ast from the ported output.
"""

from __future__ import annotations

import ast

from ddpkit.port.localcode import class_named, local_imports
from ddpkit.port.weights import ast_dotted
from ddpkit.port.wrapped import wrapped_classes

__all__ = ["unsynced_heads"]


def _batchnorm_1d(node: ast.AST) -> ast.Call | None:
    """The first `nn.BatchNorm1d(...)` call inside `node`, else None."""
    return next((n for n in ast.walk(node) if isinstance(n, ast.Call)
                 and ast_dotted(n.func).rsplit(".", 1)[-1] == "BatchNorm1d"), None)


def _classes_with_batchnorm(tree: ast.Module) -> dict[str, ast.Call]:
    """Class of this file -> the BatchNorm1d call it holds, itself or through a class of this file it builds."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    found = {name: bn for name, cls in classes.items() if (bn := _batchnorm_1d(cls)) is not None}
    grew = True
    while grew:
        grew = False
        for name, cls in classes.items():
            built = [found[ast_dotted(n.func)] for n in ast.walk(cls) if isinstance(n, ast.Call)
                     and ast_dotted(n.func) in found] if name not in found else []
            if built:
                found[name] = built[0]
                grew = True
    return found


def _unlabelled_loop(tree: ast.Module, loops: list[tuple[int, int]]) -> ast.For | None:
    """The first loop over a ported loader (`loops`: their line spans) that drops the labels of each batch:
    `for (x1, x2), _ in loader`, `for images, _ in tqdm(loader)`."""
    starts = {a for a, _ in loops}
    return next((n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno in starts
                 and isinstance(n.target, ast.Tuple) and len(n.target.elts) >= 2
                 and isinstance(n.target.elts[-1], ast.Name) and n.target.elts[-1].id == "_"), None)


def _synced(call: ast.Call) -> bool:
    return any(k.arg == "sync_batchnorm" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
               for k in call.keywords)


def unsynced_heads(tree: ast.Module, loops: list[tuple[int, int]], folder: str | None = None,
                   modules: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """(line, message) for each `ddpkit.wrap(model, ...)` of a model holding a BatchNorm1d head, in a file that trains
    without labels (see the module's policy) and wraps it without `sync_batchnorm=True`. The model's class is the
    script's own, or one of its project's modules (`folder`, `modules`: from model import SimSiam)."""
    loop = _unlabelled_loop(tree, loops)
    if loop is None:
        return []
    classes = _classes_with_batchnorm(tree)
    parsed: dict[str, ast.Module | None] = {}
    imported = local_imports(tree, modules or {}, folder, parsed) if folder is not None else {}
    out = []
    for call, cls in wrapped_classes(tree):
        found = class_named(tree, cls, folder, modules or {}, parsed, imported) if cls not in classes else None
        bn = classes.get(cls) if found is None else _classes_with_batchnorm(found[1]).get(found[2].name)
        if bn is None or _synced(call):
            continue
        model = call.args[0]
        where = f"{found[0].rsplit('/', 1)[-1]}:" if found is not None and found[0] else "line "
        named = f"`{ast.unparse(model)}`" + (f" ({cls})" if isinstance(model, ast.Name) else "")
        out.append((call.lineno, f"not checked: {named} holds `{ast.unparse(bn)}` ({where}"
                                 f"{bn.lineno}) and trains without labels (line {loop.lineno} drops them): each "
                                 "rank's BatchNorm now normalises over batch_size // world_size samples (64 // 8 = 8 "
                                 "on 8 GPUs), and a self-supervised head depends on those batch statistics; pass "
                                 "sync_batchnorm=True to ddpkit.wrap (torch.nn.SyncBatchNorm.convert_sync_batchnorm) "
                                 "to normalise over the global batch"))
    return out

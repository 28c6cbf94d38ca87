"""Losses that compare the samples of a batch with each other: similarity matrices, in-batch negatives.

Under DDP each rank computes the loss over its own batch_size // world_size samples, so a contrastive loss (SimCLR's
NT-Xent, InfoNCE, a triplet loss mining the batch) meets world_size times fewer negatives than the original and is
another loss, unless the embeddings of every rank are gathered first. A per-sample loss (BYOL's cosine between two
views of one sample) is unaffected. Read with ast from the definition the training loss comes from.
"""

from __future__ import annotations

import ast

__all__ = ["batch_similarity"]

_MATMULS = ("mm", "matmul")
_PAIRWISE = ("cdist",)


def batch_similarity(defn: ast.AST) -> tuple[int, str] | None:
    """(line, code) of the first place a definition compares every sample of a batch with every other: a matrix
    product with a transposed operand (`torch.mm(z, z.t())`, `a @ b.T`, `torch.matmul(x, y.transpose(0, 1))`),
    `torch.cdist(a, b)`, or a cosine similarity of `x.unsqueeze(1)` against `y.unsqueeze(0)`. Transposes of the last
    two of more dimensions (`k.transpose(-2, -1)`, attention) are not comparisons of samples."""
    for node in ast.walk(defn):
        if _compares(node):
            return node.lineno, ast.unparse(node)
    return None


def _compares(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return _transposed(node.right)
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id \
        if isinstance(node.func, ast.Name) else ""
    if name in _MATMULS:
        return any(_transposed(a) for a in node.args)
    if name in _PAIRWISE:
        return True
    if name == "cosine_similarity" and len(node.args) >= 2:
        return {_unsqueezed(node.args[0]), _unsqueezed(node.args[1])} == {0, 1}
    return False


def _transposed(node: ast.AST) -> bool:
    """`z.t()`, `z.T`, `z.transpose(0, 1)` / `(1, 0)`, `z.permute(1, 0)`: the samples of a 2-d batch as columns. Not
    a module's own tensor (`self.proxies.t()`, `self.fc.weight.T`: classes or proxies, learned, not samples)."""
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return _batch_value(node.value)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    dims = [a.value for a in node.args if isinstance(a, ast.Constant)]
    return (node.func.attr == "t" or (node.func.attr in ("transpose", "permute") and sorted(dims) == [0, 1]
                                      and len(node.args) == 2)) and _batch_value(node.func.value)


def _batch_value(node: ast.AST) -> bool:
    """A value the loss was handed or computed, not an attribute of the module (`self.proxies`) or a weight."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and node.attr == "weight":
            return False
        node = node.func if isinstance(node, ast.Call) else node.value
    return not (isinstance(node, ast.Name) and node.id == "self")


def _unsqueezed(node: ast.AST) -> int | None:
    """The dimension of `x.unsqueeze(d)` (0 or 1), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "unsqueeze" and \
            node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in (0, 1):
        return node.args[0].value
    return None

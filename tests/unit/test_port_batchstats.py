"""BatchNorm heads of a self-supervised model: the port names them where each rank's batch shrinks their statistics,
and leaves ordinary BatchNorm classifiers alone."""

from __future__ import annotations

from ddpkit.port import port_source

SELF_SUPERVISED = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Head(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x):
        return self.net(x)


class Online(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 16)
        self.projector = Head(16)

    def forward(self, x):
        return self.projector(self.encoder(x))


data = TensorDataset(torch.randn(64, 4), torch.randn(64, 4), torch.zeros(64))
loader = DataLoader(data, batch_size=64, shuffle=True)
model = Online()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for {target} in loader:
        a, b = F.normalize(model(x1), dim=-1), F.normalize(model(x2), dim=-1)
        loss = (2 - 2 * (a * b).sum(dim=-1)).mean(){labels}
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def _todos(target: str, labels: str = "") -> list[str]:
    result = port_source(SELF_SUPERVISED.format(target=target, labels=labels), "byol.py")
    return [t.message for t in result.todos if "BatchNorm" in t.message]


def test_a_batchnorm_head_trained_without_labels_is_named_at_its_wrap():
    todos = _todos("x1, x2, _")
    assert len(todos) == 1, todos
    assert "`Online()` holds `nn.BatchNorm1d(32)` (line 11)" in todos[0] and "sync_batchnorm=True" in todos[0]


def test_a_batchnorm_model_trained_on_its_labels_is_left_alone():
    assert _todos("x1, x2, y", " + F.mse_loss(a.sum(1), y)") == []


def test_a_wrap_that_already_syncs_batchnorm_is_left_alone():
    from ddpkit.port.batchstats import unsynced_heads
    import ast

    code = port_source(SELF_SUPERVISED.format(target="x1, x2, _", labels=""), "byol.py").code
    synced = code.replace("ddpkit.wrap(Online(), ctx)", "ddpkit.wrap(Online(), ctx, sync_batchnorm=True)").replace(
        "ddpkit.wrap(model, ctx)", "ddpkit.wrap(model, ctx, sync_batchnorm=True)")
    assert "sync_batchnorm=True" in synced
    tree = ast.parse(synced)
    from ddpkit.port.project import step_loops
    assert unsynced_heads(tree, step_loops(tree)) == []

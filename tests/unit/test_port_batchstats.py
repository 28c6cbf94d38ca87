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


def test_a_batchnorm_head_of_a_class_in_a_project_module_is_named_at_its_wrap(tmp_path):
    # the SimSiam class lives in model.py beside the script: its projector's BatchNorm1d is the same objective
    (tmp_path / "model.py").write_text("import torch.nn as nn\n\n\nclass Projector(nn.Module):\n"
                                       "    def __init__(self):\n        super().__init__()\n"
                                       "        self.net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))\n\n"
                                       "    def forward(self, x):\n        return self.net(x)\n\n\n"
                                       "class SimSiam(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                       "        self.proj = Projector()\n\n    def forward(self, x):\n"
                                       "        return self.proj(x)\n")
    source = ("import torch\nfrom torch.utils.data import DataLoader\nfrom model import SimSiam\n\nmodel = SimSiam()\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nloader = DataLoader(ds, batch_size=64, shuffle=True)\n"
              "for (x1, x2), _ in loader:\n    loss = -(model(x1) * model(x2)).sum()\n    opt.zero_grad()\n"
              "    loss.backward()\n    opt.step()\n")
    (tmp_path / "train.py").write_text(source)
    named = [t for t in port_source(source, str(tmp_path / "train.py")).todos if "sync_batchnorm=True" in t.message]
    assert len(named) == 1 and "model.py:7" in named[0].message and "`SimSiam()`" in named[0].message, named

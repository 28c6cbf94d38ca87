"""A script that names no device, wraps no model and hands its loaders to its project's code: the port keeps every
rank on the CPU only where that code needs CPU tensors, and says so in a TODO naming the lines."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.port import port_source

SCRIPT = '''\
from torch.utils.data import DataLoader, TensorDataset
import torch
from net import Net
from training import fit, score

data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
train_loader = DataLoader(data, batch_size=16, shuffle=True)
test_loader = DataLoader(data, batch_size=16)
model = Net()
fit(model, train_loader, epochs=2)
print(score(model, test_loader))
'''

NET = '''\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
'''

TRAINING = '''\
import torch


def fit(model, loader, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def score(model, loader):
    hits = []
    with torch.no_grad():
        for x, y in loader:
            hits.extend((model(x).argmax(1) == y){read})
    return sum(hits) / len(hits)
'''


def _project(tmp_path: Path, read: str) -> Path:
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "training.py").write_text(TRAINING.replace("{read}", read))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return script


def test_project_code_that_reads_batches_with_numpy_keeps_the_cpu_and_names_the_line_in_a_todo(tmp_path):
    script = _project(tmp_path, ".numpy()")
    result = port_source(script.read_text(), str(script))
    assert 'ddpkit.init(device="cpu")' in result.code
    todo = [t.message for t in result.todos if t.message.startswith('ddpkit.init(device="cpu") keeps every rank')]
    assert len(todo) == 1 and "training.py:17 `" in todo[0] and "drop device=" in todo[0], todo
    assert 'device="cpu"' not in result.message  # a TODO, not a note on the summary line
    assert result.exit_code == 3


def test_project_code_that_runs_on_any_device_gets_the_default_device(tmp_path):
    script = _project(tmp_path, ".cpu().numpy()")
    result = port_source(script.read_text(), str(script))
    assert 'device="cpu"' not in result.code and "ddpkit.init()" in result.code
    assert not any("keeps every rank on the CPU" in t.message for t in result.todos)
    # the model is still to be wrapped (it then moves to ctx.device with the batches)
    assert any("no model is wrapped" in t.message for t in result.todos), [t.message for t in result.todos]


def test_a_legacy_typed_tensor_made_in_the_training_code_keeps_the_cpu(tmp_path):
    script = _project(tmp_path, ".tolist()")
    (tmp_path / "training.py").write_text((tmp_path / "training.py").read_text().replace(
        "model(x).argmax(1) == y", "model(x).argmax(1) == torch.LongTensor(y.tolist())"))
    result = port_source(script.read_text(), str(script))
    assert 'ddpkit.init(device="cpu")' in result.code
    assert any("training.py:17 `torch.LongTensor(...)`" in t.message for t in result.todos)


def test_tensors_brought_to_the_host_before_numpy_are_not_cpu_only():
    import ast

    from ddpkit.port.cpuonly import cpu_only_of

    for code in ("x.cpu().numpy()", "x.detach().cpu().numpy()", "x.data.cpu().numpy()", "x.to('cpu').numpy()"):
        assert cpu_only_of(ast.parse(code).body[0].value) == "", code
    assert cpu_only_of(ast.parse("x.detach().numpy()").body[0].value) == "`x.detach().numpy()`"

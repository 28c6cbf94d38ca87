"""ddpkit port names the CPU tensors a wrapped model makes in its own forward (ddpkit.port.hosttensors)."""

from __future__ import annotations

import ast
from pathlib import Path

from ddpkit.port import port_source
from ddpkit.port.hosttensors import host_tensors

MODEL = '''import torch
import torch.nn as nn


class LSTMModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 8, 1, batch_first=True)
        self.fc = nn.Linear(8, 1)

    def forward(self, x):
        h0 = {h0}
        out, _ = self.lstm(x, (h0, self.init_cell(x)))
        return self.fc(out[:, -1, :])

    def init_cell(self, x):
        return {c0}
'''
SCRIPT = '''import torch
from torch.utils.data import DataLoader
{imports}

model = {build}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(ds, batch_size=64, shuffle=True)
for x, y in loader:
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''
CPU_STATE = "torch.zeros(1, x.size(0), 8).requires_grad_()"


def _named(result) -> list:  # noqa: ANN001
    return [t for t in result.todos if "makes tensors on the CPU in its forward" in t.message]


def _port(tmp_path: Path, h0: str, c0: str, imports: str, build: str):  # noqa: ANN202
    (tmp_path / "model.py").write_text(MODEL.format(h0=h0, c0=c0))
    script = tmp_path / "train.py"
    source = SCRIPT.format(imports=imports, build=build)
    script.write_text(source)
    return port_source(source, str(script))


def test_an_lstm_state_made_on_the_cpu_in_a_project_models_forward_is_named_at_the_wrap(tmp_path: Path):
    # the port puts the model and its batches on ctx.device: zeros made without a device there meet them on the GPU
    for imports, build in [("from model import LSTMModel", "LSTMModel()"), ("import model as M", "M.LSTMModel()")]:
        result = _port(tmp_path, CPU_STATE, "torch.zeros(1, x.size(0), 8)", imports, build)
        named = _named(result)
        assert len(named) == 1 and "model.py:12, 17" in named[0].message, result.todos
        assert "`LSTMModel`" in named[0].message and "`torch.zeros(...)`" in named[0].message


def test_tensors_made_on_the_inputs_device_or_moved_there_are_left_alone(tmp_path: Path):
    for h0, c0 in [("torch.zeros(1, x.size(0), 8, device=x.device)", "x.new_zeros(1, x.size(0), 8)"),
                   ("torch.zeros(1, x.size(0), 8).to(x.device)", "torch.zeros(1, x.size(0), 8).type_as(x)")]:
        result = _port(tmp_path, h0, c0, "from model import LSTMModel", "LSTMModel()")
        assert not _named(result), result.todos


def test_a_port_that_keeps_every_rank_on_the_cpu_names_no_cpu_tensor():
    src = ("import torch\nimport torch.nn as nn\nimport ddpkit\n\n\nclass Net(nn.Module):\n    def forward(self, x):\n"
           "        return x + torch.randn(x.shape)\n\n\nctx = ddpkit.init(device=\"cpu\")\n"
           "model = ddpkit.wrap(Net(), ctx)\n")
    tree = ast.parse(src)
    assert host_tensors(tree, None, {}) == []
    assert [line for line, _ in host_tensors(ast.parse(src.replace('device="cpu"', "")), None, {})] == [12]


def test_a_project_function_that_builds_such_a_model_is_named_where_the_script_wraps_none(tmp_path: Path):
    # the script hands training to train.py, which builds the model: the port wraps nothing, and once the user wraps
    # it on ctx.device as the port's TODO asks, the forward's CPU zeros meet the GPU input
    (tmp_path / "model.py").write_text(MODEL.format(h0=CPU_STATE, c0="torch.zeros(1, x.size(0), 8)"))
    (tmp_path / "fit.py").write_text("import torch\nfrom model import LSTMModel\n\n\ndef train_lstm(x, y):\n"
                                     "    model = LSTMModel()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                                     "    return model\n")
    source = "import torch\nfrom fit import train_lstm\n\nx = torch.randn(8, 5, 4)\nmodel = train_lstm(x, x)\n"
    (tmp_path / "main.py").write_text(source)
    result = port_source(source, str(tmp_path / "main.py"))
    named = [t for t in result.todos if "whose forward makes tensors on the CPU" in t.message]
    assert len(named) == 1 and "`LSTMModel` (fit.py:6)" in named[0].message, result.todos
    assert "model.py:12, 17" in named[0].message

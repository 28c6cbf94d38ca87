"""`ddpkit port`: a wrap of an object whose class (of the script or its project) is no nn.Module is undone and
named with the attribute that holds the network and the method that runs the step."""

from __future__ import annotations

import ast
import textwrap

from ddpkit.port import port_source

_TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
from holder import Diffuser


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


def main():
    diffuser = Diffuser(Net(), steps=10)
    optimizer = torch.optim.Adam(diffuser.net.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True)
    for epoch in range(2):
        for (x,) in loader:
            diffuser.train_step(x, optimizer)


if __name__ == "__main__":
    main()
"""

_HOLDER = """\
import torch
{base_import}


class {base}:
    pass


class Diffuser({base_name}):
    def __init__(self, net, steps=1000):
        self.net = net
        self.steps = steps

    def train_step(self, x, optimizer):
        loss = (self.net(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _port(tmp_path, base: str = "Base", base_name: str = "Base", base_import: str = ""):
    (tmp_path / "holder.py").write_text(_HOLDER.format(base=base, base_name=base_name, base_import=base_import))
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    return port_source(script.read_text(), str(script))


def test_a_class_of_the_project_that_holds_the_network_is_not_wrapped_and_its_attribute_and_step_are_named(tmp_path):
    result = _port(tmp_path)
    assert "ddpkit.wrap(Diffuser(" not in result.code and "ddpkit.unwrap(diffuser)" not in result.code
    lines = [line.strip() for line in result.code.splitlines()]
    assert "diffuser = Diffuser(Net(), steps=10)" in lines
    [todo] = [t for t in result.todos if "is not an nn.Module" in t.message]
    assert result.code.splitlines()[todo.line - 1].strip() == "diffuser = Diffuser(Net(), steps=10)"
    assert "`Diffuser` (holder.py:9)" in todo.message and "`net`" in todo.message
    assert "`train_step` (holder.py:14) runs the step" in todo.message
    assert "diffuser.net = ddpkit.wrap(diffuser.net, ctx)" in todo.message
    ast.parse(result.code)


def test_a_class_whose_project_base_is_an_nn_module_or_a_librarys_class_is_still_wrapped(tmp_path):
    module_base = _port(tmp_path, base="Base(torch.nn.Module)")
    assert not [t for t in module_base.todos if "is not an nn.Module" in t.message]
    assert "ddpkit.wrap(Diffuser(" in module_base.code
    library = _port(tmp_path, base="Unused", base_name="LightningModule",
                    base_import="from pytorch_lightning import LightningModule")
    assert not [t for t in library.todos if "is not an nn.Module" in t.message]

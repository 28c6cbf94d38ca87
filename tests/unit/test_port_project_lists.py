"""What the project's own code does on every rank, named whole: every item of a `not checked:` TODO on a line of
its own (none hidden behind "and N more"), blockers first; downloads and exports reached through its methods."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source
from ddpkit.port.codemod import open_todos

_TRAIN = """\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, x):
            return self.fc(x)
"""


def _write(folder, files: dict[str, str]):
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))


def test_every_item_a_helper_holds_is_listed_one_a_line_with_the_crash_first(tmp_path):
    _write(tmp_path, {"export.py": """\
        import pickle
        import torch


        def publish(model, name):
            torch.save(model.state_dict(), name + ".pt")
            torch.onnx.export(model, torch.randn(1, 4), name + ".onnx")
            with open(name + ".txt", "w") as f:
                f.write(name)
            pickle.dump(name, open(name + ".pkl", "wb"))
            torch.save(name, name + ".name")
            torch.zeros(1, device="cuda:1")
    """, "train.py": _TRAIN + """\
    from export import publish

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
    for x, y in data:
        optimizer.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        optimizer.step()
    publish(model, "net")
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    todo = next(t.message for t in result.todos if "`publish` in export.py" in t.message)
    assert "more)" not in todo
    items = todo.split("\n")[1:]
    assert items[0].startswith("- export.py:12 `torch.zeros(1, device='cuda:1')` chooses a device"), items
    assert any("`torch.onnx.export(...)` writes or downloads on every rank" in i for i in items), items
    assert len(items) >= 6 and all(i.startswith("- export.py:") for i in items), items
    # the ported file carries each item on a comment line of its own, and reads back whole
    assert "\n#   - export.py:12 `torch.zeros(1, device='cuda:1')`" in result.code
    assert todo in [t.message for t in open_todos(result.code)]


def test_a_download_in_a_method_of_a_project_class_runs_on_rank_0_first(tmp_path):
    _write(tmp_path, {"data.py": """\
        from torch.utils.data import DataLoader
        from torchvision import datasets


        class Data:
            def __init__(self, batch_size):
                self.batch_size = batch_size

            def loaders(self):
                train = datasets.MNIST("./data", train=True, download=True)
                return DataLoader(train, batch_size=self.batch_size, shuffle=True)
    """, "train.py": _TRAIN + """\
    from data import Data

    data = Data(16)
    loader = data.loaders()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        optimizer.step()
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    code = result.code
    at = code.index("loader = data.loaders()")
    assert "if not ctx.is_main:" in code[:at] and "ddpkit.barrier(ctx)" in code[at:], code


def test_a_loader_the_project_returns_is_not_called_a_shard_where_that_binding_reaches(tmp_path):
    _write(tmp_path, {"data.py": """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Data:
            def loaders(self):
                data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
                return DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8)
    """, "steps.py": """\
        def fit(model, optimizer, loader):
            losses = []
            for x, y in loader:
                optimizer.zero_grad()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            return losses
    """, "train.py": _TRAIN + """\
    import sys
    from data import Data
    from steps import fit

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if sys.argv[1:] != ["--head"]:
        train_loader, valid_loader = Data().loaders()
        losses = fit(model, optimizer, train_loader)
        print(losses)
    else:
        train_loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
        for x, y in train_loader:
            optimizer.zero_grad()
            (model(x) - y).pow(2).mean().backward()
            optimizer.step()
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    messages = [t.message for t in result.todos]
    assert not any("this rank's shard of `train_loader`" in m for m in messages), messages
    found = [m for m in messages if m.startswith("`train_loader` handed to `fit(...)` here is the one line")]
    assert found and "`Data().loaders()`" in found[0] and "not sharded" in found[0], messages


def test_an_evaluation_shard_handed_to_code_outside_the_file_as_a_statement_is_named(tmp_path):
    _write(tmp_path, {"checks.py": """\
        import torch


        def validate(model, loader, patience):
            total = sum(float((model(x) - y).pow(2).mean()) for x, y in loader)
            print("val loss", total / len(loader))
            if total > patience:
                torch.save(model.state_dict(), "best.pt")
    """, "train.py": _TRAIN + """\
    from checks import validate

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
    val_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
    for epoch in range(2):
        for x, y in train_loader:
            optimizer.zero_grad()
            (model(x) - y).pow(2).mean().backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x)
        validate(model, val_loader, 3)
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    assert "ddpkit.eval_loader(" in result.code
    found = [t.message for t in result.todos if t.message.startswith("not checked: `validate(...)`, defined outside")]
    assert found and "this rank's shard of `val_loader`" in found[0], [t.message[:80] for t in result.todos]

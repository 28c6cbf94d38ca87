"""What the port adds must not break what the script already had: its own `ctx`, a device read as a str or handed to
autocast as a device type, a submodule of the wrapped model called on its own, batches of a kept CPU loader."""

from __future__ import annotations

import ast
import textwrap

from ddpkit.port import port_source


def _port(text: str, path: str = "<string>"):
    return port_source(textwrap.dedent(text), path)


def _bindings(code: str, name: str) -> list[ast.AST]:
    return [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]


_AUTOCAST = """
import argparse
from contextlib import nullcontext

import torch


def evaluate(model, ctx, x):
    with ctx:
        return model(x).mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = nullcontext() if device == "cpu" else torch.amp.autocast(device_type=device, dtype=torch.bfloat16)
    model = torch.nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    for epoch in range(args.epochs):
        for (x,) in loader:
            x = x.to(device)
            with ctx:
                loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(epoch, evaluate(model, ctx, x))


if __name__ == "__main__":
    main()
"""


def test_the_scripts_own_ctx_is_renamed_and_autocast_gets_a_device_type():
    result = _port(_AUTOCAST)
    tree = ast.parse(result.code)
    [own] = _bindings(result.code, "script_ctx")  # the autocast context, under a name the script does not use
    assert "autocast" in ast.unparse(own.value)
    assert not [b for b in _bindings(result.code, "ctx")]  # `ctx` is ddpkit.init's alone (a `with ... as ctx`)
    [evaluate] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "evaluate"]
    assert [a.arg for a in evaluate.args.args] == ["model", "script_ctx", "x"]
    assert "with script_ctx:" in ast.unparse(evaluate)
    [call] = [n for n in ast.walk(own.value) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("autocast")]
    [device_type] = [k.value for k in call.keywords if k.arg == "device_type"]
    assert ast.unparse(device_type) == "torch.device(device).type"  # "cuda", never "cuda:1"
    assert "the script's own name `ctx` is renamed `script_ctx`" in result.message


def test_a_script_without_its_own_ctx_is_not_renamed():
    result = _port(_AUTOCAST.replace("ctx", "amp_context"))
    assert "script_ctx" not in result.code and "renamed" not in result.message
    assert "device_type=torch.device(device).type" in result.code


_STEP = """    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    for (x,) in loader:
        loss = {loss}
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
"""
"""A training step over a small loader, ending `main()`; `model` and `opt` made above it."""

_STR_DEVICE = """
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device_name = args.device.lower()
    if device_name == "cuda" and torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    model = torch.nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
""" + _STEP.format(loss="model(x.to(device)).pow(2).mean()")


def test_a_device_setting_the_script_reads_as_a_str_stays_a_str():
    result = _port(_STR_DEVICE)
    [binding] = _bindings(result.code, "device_name")
    assert ast.unparse(binding.value) == "ctx.device.type.lower()"  # "cuda", as the setting was
    assert 'if device_name == "cuda"' in result.code  # compared as the str it is, never `device_name.type`


_SUBMODULES = """
import torch


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.main = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.main(x))


def main():
    encoder = Encoder().to("cuda")
    features = encoder.main.to("cuda")
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
""" + _STEP.format(loss="features(x).pow(2).mean() + encoder(x).mean()")


def test_a_submodule_of_the_wrapped_model_called_under_its_own_name_in_the_step_is_a_todo():
    result = _port(_SUBMODULES)
    assert result.exit_code == 3
    [todo] = [t for t in result.todos if "submodule of the wrapped model" in t.message]
    assert todo.message.startswith("`features(...)` calls `encoder.main`")


def test_a_submodule_called_only_under_no_grad_is_no_todo():
    text = _SUBMODULES.replace("        loss = features(x).pow(2).mean() + encoder(x).mean()\n",
                               "        with torch.no_grad():\n            shown = features(x)\n"
                               "        loss = encoder(x).mean()\n")
    assert text != _SUBMODULES
    result = _port(text)
    assert not [t for t in result.todos if "submodule of the wrapped model" in t.message]


_KEPT_LOADERS = """
import numpy as np
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset


def make_loaders(dataset, batch_size):
    indices = list(range(len(dataset)))
    np.random.shuffle(indices)
    train_loader = DataLoader(dataset, batch_size=batch_size, sampler=SubsetRandomSampler(indices[:48]))
    valid_loader = DataLoader(dataset, batch_size=batch_size, sampler=SubsetRandomSampler(indices[48:]))
    return train_loader, valid_loader


def run_epoch(model, opt, train_loader):
    for images, _ in train_loader:
        outputs = model(images)
        loss = torch.nn.functional.mse_loss(outputs, images)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main():
    dataset = TensorDataset(torch.randn(64, 4), torch.zeros(64))
    train_loader, valid_loader = make_loaders(dataset, 8)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        run_epoch(model, opt, train_loader)


if __name__ == "__main__":
    main()
"""


def test_batches_of_torch_loaders_a_helper_returns_are_moved_to_the_models_device():
    result = _port(_KEPT_LOADERS)
    body = result.code[result.code.index("def run_epoch"):]
    assert body.index("images = ddpkit.device.to_device(images, ctx.device)") < body.index("outputs = model(images)")


def test_batches_of_such_loaders_a_helper_of_the_script_changes_before_the_model_are_a_todo():
    text = _KEPT_LOADERS.replace("def run_epoch", "def add_noise(x):\n    return np.clip(x + torch.randn(*x.shape), 0, 1)"
                                 "\n\n\ndef run_epoch").replace("outputs = model(images)",
                                                                  "outputs = model(add_noise(images))")
    text = text.replace("        outputs = model(add_noise(images))", "        noisy = add_noise(images)\n"
                        "        outputs = model(noisy)")
    result = _port(text)
    assert result.exit_code == 3
    assert [t for t in result.todos if t.message.startswith("`noisy` comes from a batch of `train_loader`")]

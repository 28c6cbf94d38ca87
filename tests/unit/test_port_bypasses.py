"""The project's training code that runs a model through `.module` (`gen.module.infer(z)`): past the DDP wrapper,
so the gradients of that forward are never averaged across ranks."""

from __future__ import annotations

import ast

from ddpkit.port import port_source
from ddpkit.port.asks import bypass_of

_TRAINER = """import torch


class Trainer:
    def __init__(self, models, opt, loader):
        self.models, self.opt, self.loader = models, opt, loader

    def train(self):
        gen = self.models["gen"]
        for x in self.loader:
            z = gen.module.sample(x.size(0))
            fake = gen.module.infer(z)
            loss = fake.mean() + self.models["dis"](x).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            with torch.no_grad():
                shown = gen.module.infer(z)
            state = gen.module.state_dict()
"""

_SCRIPT = """import torch
from torch.utils.data import DataLoader

from trainer import Trainer


def main():
    gen, dis = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(list(gen.parameters()) + list(dis.parameters()), lr=0.1)
    loader = DataLoader(torch.zeros(8, 4), batch_size=4, shuffle=True)
    trainer = Trainer({"gen": gen, "dis": dis}, opt, loader)
    trainer.train()


if __name__ == '__main__':
    main()
"""


def _bypasses(code: str) -> list[str]:
    tree = ast.parse(code)
    defn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train")
    return [b for n in ast.walk(defn) if (b := bypass_of(n, defn))]


def test_a_forward_past_the_wrapper_in_a_training_function_is_named_not_a_read_or_one_without_gradients():
    # the sampling helper, the forward; not the forward under no_grad, nor the state_dict
    assert _bypasses(_TRAINER) == ["`gen.module.sample(...)`", "`gen.module.infer(...)`"]
    # a module's own submodule called `module` (`self.module(x)`) is no wrapper
    assert _bypasses("def train(self, x):\n    self.module(x).sum().backward()\n") == []
    # a function that trains nothing: a look at the model past the wrapper is fine
    assert _bypasses("def train(model, z):\n    return model.module.infer(z)\n") == []


def test_the_scripts_call_into_training_code_that_runs_a_model_past_the_wrapper_is_a_todo(tmp_path):
    (tmp_path / "trainer.py").write_text(_TRAINER)
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    result = port_source(script.read_text(), str(script))
    [todo] = [t for t in result.todos if "past its DDP wrapper" in t.message]
    assert todo.message.startswith("`trainer.train()` runs the project's training code on every rank")
    assert "trainer.py:11 `gen.module.sample(...)`, trainer.py:12 `gen.module.infer(...)`" in todo.message
    assert "ported fully" not in result.message

"""An object's attribute that holds the rank: `self.device = device` in a class every construction of which gives
`device` the rank (`Trainer(model, device=rank, **config)`), so `if self.device == 0:` in its methods is a rank
check; and a module found in a folder its importer put on sys.path (`sys.path.append("../utils")`)."""

from __future__ import annotations

import ast
import textwrap

from ddpkit.lint import lint_sources
from ddpkit.lint.imports import Modules


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_TRAINER = """
    class Trainer:
        def __init__(self, model, optimizer, device, **settings):
            self.model = model
            self.optimizer = optimizer
            self.device = device
            self.epochs = settings["epochs"]

        def fit(self, loader):
            for epoch in range(self.epochs):
                for x, y in loader:
                    self.optimizer.zero_grad()
                    loss = (self.model(x.to(self.device)) - y.to(self.device)).pow(2).mean()
                    loss.backward()
                    self.optimizer.step()
                if self.device == 0:
                    print("finished epoch", epoch)
"""

_MAIN = """
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    {path}
    from trainer import Trainer


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(4, 1).to(rank), device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model, optimizer, device={device}, **{{"epochs": 2}})
        trainer.fit(loader())
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""

_PRINT = 'print("finished epoch", epoch)'


def test_attribute_the_constructor_fills_with_the_rank_is_a_rank_check():
    found = _found({"main.py": _MAIN.format(path="", device="rank"), "trainer.py": _TRAINER})
    assert ("trainer.py", _PRINT, "DDP008") not in found


def test_attribute_filled_with_something_else_is_no_rank_check():
    found = _found({"main.py": _MAIN.format(path="", device='"cuda:0"'), "trainer.py": _TRAINER})
    assert ("trainer.py", _PRINT, "DDP008") in found


def test_module_on_a_folder_the_importer_adds_to_sys_path():
    main = textwrap.dedent(_MAIN.format(path='sys.path.append("../utils")', device="rank"))
    trees = {"pretrain/main.py": ast.parse(main), "utils/trainer.py": ast.parse(textwrap.dedent(_TRAINER)),
             "tools/run.py": ast.parse("from trainer import Trainer\n")}
    modules = Modules(list(trees), trees)
    assert modules.locate("pretrain/main.py", "trainer") == "utils/trainer.py"
    assert modules.locate("tools/run.py", "trainer") is None  # (no sys.path entry there: another module)
    files = {"pretrain/main.py": main, "utils/trainer.py": _TRAINER}
    assert ("utils/trainer.py", _PRINT, "DDP008") not in _found(files)

"""A rank the program hands to a class through a keyword beside a `**config` spread, and modules the entry script
reaches through a folder it puts on sys.path itself (`sys.path.append("../utils")`): code under
`if self.device == 0:` in that class, where `device` is the global rank, runs on rank 0 alone."""

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
    import torch

    from evaluate import evaluate


    class Trainer:
        def __init__(self, model, optimizer, device, name, **args):
            self.model = model
            self.optimizer = optimizer
            self.device = device
            self.name = name
            self.epochs = args["epochs"]

        def fit(self, loader):
            for epoch in range(self.epochs):
                for x, y in loader:
                    x, y = x.to(self.device), y.to(self.device)
                    self.optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                if self.device == 0:
                    print("epoch", epoch, "done")
                    torch.save(self.model.module.state_dict(), self.name + ".pt")
                    evaluate(self.model, loader)
"""

_EVALUATE = """
    import torch
    from tqdm import tqdm


    def evaluate(model, loader):
        total = 0.0
        for x, y in tqdm(loader):
            total += torch.nn.functional.mse_loss(model(x), y).item()
        print("validation loss", total)
"""

_ENTRY = """
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    sys.path.append(IMPORT_PATH)
    from trainer import Trainer


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        torch.cuda.set_device(rank % torch.cuda.device_count())
        config = {"trainer": {"epochs": 2}}
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        model = DDP(torch.nn.Linear(4, 1).to(rank), device_ids=[rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(model=model, optimizer=optimizer, device=rank, name="run", **config["trainer"])
        trainer.fit(loader)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _program(import_path: str) -> dict[str, str]:
    return {"pretrain/main.py": _ENTRY.replace("IMPORT_PATH", import_path), "utils/trainer.py": _TRAINER,
            "utils/evaluate.py": _EVALUATE}


def test_a_rank_passed_by_keyword_beside_a_spread_config_guards_the_class_code():
    found = _found(_program('"../utils"'))
    assert not {f for f in found if f[0].startswith("utils/") and f[2] in ("DDP008", "DDP004")}, found


def test_a_folder_named_through_file_is_followed_too():
    program = _program('os.path.join(os.path.dirname(__file__), "..", "utils")')
    program["pretrain/main.py"] = "import os\n" + textwrap.dedent(program["pretrain/main.py"])
    found = _found(program)
    assert not {f for f in found if f[0].startswith("utils/") and f[2] in ("DDP008", "DDP004")}, found


def test_the_same_class_given_a_constant_device_still_reports():
    # `device=0` on every rank: `if self.device == 0:` holds everywhere, so every rank saves (the print under a test of a
    # device is left out as doubtful)
    program = _program('"../utils"')
    program["pretrain/main.py"] = program["pretrain/main.py"].replace("device=rank,", "device=0,")
    found = _found(program)
    assert ("utils/trainer.py", 'torch.save(self.model.module.state_dict(), self.name + ".pt")', "DDP004") in found


def test_sys_path_folders_resolve_only_literal_paths():
    trees = {"a/main.py": ast.parse('import sys\nsys.path.append("../lib")\nsys.path.append(get())\nimport helper\n'),
             "lib/helper.py": ast.parse("x = 1\n"), "other/helper2.py": ast.parse("y = 1\n")}
    modules = Modules(list(trees), trees)
    assert modules.locate("a/main.py", "helper") == "lib/helper.py"
    assert modules.locate("a/main.py", "helper2") is None
    assert modules.locate("lib/helper.py", "main") is None


_PREPROCESS = """
    import logging

    logger = logging.getLogger(__name__)
    logging.basicConfig(level=logging.INFO)


    class GenePrep:
        def __init__(self, filter_genes=False, binning=None):
            self.filter_genes = filter_genes
            self.binning = binning

        def __call__(self, data):
            if self.filter_genes:
                logger.info("filtering genes")
            if self.binning:
                logger.info("binning")
            return data


    class PeakPrep:
        def __init__(self, filter_genes=False, binning=None):
            self.filter_genes = filter_genes
            self.binning = binning

        def __call__(self, data):
            if self.filter_genes:
                logger.info("filtering peaks")
            return data
"""

_PREP_ENTRY = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from preprocess import GenePrep, PeakPrep


    def main():
        dist.init_process_group("gloo")
        genes = GenePrep(filter_genes=False, binning=0)(torch.randn(8, 4))
        peaks = PeakPrep(filter_genes=False)(torch.randn(8, 4))
        model = DDP(torch.nn.Linear(4, 1))
        model(genes + peaks).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_switch_every_construction_turns_off_is_off_though_another_class_has_an_attribute_of_its_name():
    found = _found({"train.py": _PREP_ENTRY, "preprocess.py": _PREPROCESS})
    assert not {f for f in found if f[0] == "preprocess.py"}, found


def test_a_subclass_that_sets_the_attribute_itself_keeps_the_branch():
    preprocess = _PREPROCESS + """

    class LoudPrep(PeakPrep):
        def __init__(self):
            super().__init__()
            self.filter_genes = True
"""
    entry = _PREP_ENTRY.replace("model = DDP(", "LoudPrep()(peaks)\n        model = DDP(")
    found = _found({"train.py": entry, "preprocess.py": preprocess})
    assert ("preprocess.py", 'logger.info("filtering peaks")', "DDP008") in found, found
    assert ("preprocess.py", 'logger.info("filtering genes")', "DDP008") not in found, found


_EXPLICIT = """
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def evaluate(model, x, device="cuda"):
        return model(x.to(device)).sum().item()


    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        model = DDP(torch.nn.Linear(4, 1).to(local_rank), device_ids=[local_rank])
        model(torch.randn(8, 4).to(local_rank)).sum().backward()
        if dist.get_rank() == 0:
            print(evaluate(model, torch.randn(8, 4), device=local_rank))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _no_set_device(found: set[tuple[str, str, str]]) -> bool:
    return any(rule == "DDP012" and line.startswith("dist.init_process_group") for _, line, rule in found)


def test_a_cuda_default_every_call_overrides_places_nothing():
    assert not _no_set_device(_found({"train.py": _EXPLICIT}))


def test_a_cuda_default_some_call_leaves_places_on_the_current_device():
    program = _EXPLICIT.replace("evaluate(model, torch.randn(8, 4), device=local_rank)",
                                "evaluate(model, torch.randn(8, 4))")
    assert _no_set_device(_found({"train.py": program}))


def test_placements_by_the_global_rank_get_that_finding_not_a_set_device_one():
    program = _EXPLICIT.replace('local_rank = int(os.environ["LOCAL_RANK"])', "local_rank = dist.get_rank()")
    found = _found({"train.py": program})
    assert not _no_set_device(found), found
    assert ("train.py", "local_rank = dist.get_rank()", "DDP012") in found, found

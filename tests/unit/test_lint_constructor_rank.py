"""A rank handed to a class's constructor and kept as an attribute, and a helper folder a script puts on sys.path:
a save under `if self.device == 0:` is rank 0's, when the class is constructed with the rank."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.lint import lint_files

TRAINER = """
    import torch
    import torch.distributed as dist


    class Trainer:
        def __init__(self, model, device, **options):
            self.model = model
            self.device = device
            self.epochs = options["epochs"]

        def fit(self, batches):
            for batch in batches:
                loss = self.model(batch.to(self.device)).sum()
                loss.backward()
                dist.all_reduce(loss.detach())
                if self.device == 0:
                    torch.save(self.model.state_dict(), "best.pt")
"""

MAIN = """
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.append("{folder}")
    from {module} import Trainer


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        model = DDP(torch.nn.Linear(4, 4).to(rank), device_ids=[rank])
        Trainer(model, device=rank, **{{"epochs": 2}}).fit([torch.zeros(2, 4)] * 3)
        dist.destroy_process_group()


    main()
"""


def _saves(tmp_path: Path, folder: str, trainer_at: str) -> list[int]:
    (tmp_path / "run").mkdir()
    (tmp_path / trainer_at).parent.mkdir(exist_ok=True)
    (tmp_path / trainer_at).write_text(textwrap.dedent(TRAINER))
    (tmp_path / "run" / "main.py").write_text(textwrap.dedent(MAIN.format(folder=folder, module="helpers")))
    files = [tmp_path / "run" / "main.py", tmp_path / trainer_at]
    return [f.line for f in lint_files(files) if f.rule == "DDP004"]


def test_constructor_given_the_rank_through_a_sys_path_folder(tmp_path):
    assert _saves(tmp_path, "../lib", "lib/helpers.py") == []


def test_constructor_given_the_rank_beside_the_script(tmp_path):
    assert _saves(tmp_path, "../lib", "run/helpers.py") == []


def test_a_folder_no_file_is_in_joins_nothing(tmp_path):
    # the helper is not where the script puts its folder on sys.path: linted alone, `self.device` is nobody's rank
    save = next(i for i, line in enumerate(textwrap.dedent(TRAINER).splitlines(), 1) if "torch.save" in line)
    assert _saves(tmp_path, "../elsewhere", "lib/helpers.py") == [save]

"""DDP004's local-rank warning names the line to change: the early exit `if self.rank != 0: return` that guards a
save below it, rather than the save itself (AG+AH round)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist


    class Trainer:
        def __init__(self, model):
            self.model = model
            self.rank = int(os.environ["LOCAL_RANK"])

        def save(self, path):
            if self.rank != 0:
                return
            torch.save(self.model.state_dict(), path)


    def main():
        dist.init_process_group("nccl")
        trainer = Trainer(torch.nn.Linear(4, 1))
        trainer.save("/shared/model.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def test_a_local_rank_early_exit_is_reported_at_the_exit():
    assert [f.line for f in lint_sources({"train.py": _TRAIN}) if f.rule == "DDP004"] == [14]


def test_a_local_rank_check_around_the_save_is_reported_at_the_save():
    around = _TRAIN.replace("if self.rank != 0:\n            return\n        torch.save",
                            "if self.rank == 0:\n            torch.save")
    assert around != _TRAIN
    assert [f.line for f in lint_sources({"train.py": around}) if f.rule == "DDP004"] == [15]

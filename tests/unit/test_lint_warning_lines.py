"""DDP008 for `logging.warning(...)` in the training loop on every rank (the step log written at WARNING): WARNING
lines are shown with no logging set-up at all (Python's last-resort handler writes them to stderr), so each appears
world_size times unless logging is set up per rank. A one-off notice outside the loop is left alone."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = """\
    import logging
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    SETUP


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
        if not torch.backends.cudnn.is_available():
            logging.warning("cudnn is not available")
        for step in range(10):
            loss = model(torch.randn(2, 4).cuda()).sum()
            loss.backward()
            logging.warning(f"step {step} loss {loss.item()}")
        try:
            torch.save(model.module.state_dict(), "m.pt")
        except OSError:
            logging.warning("could not save")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _warnings(setup: str) -> list[int]:
    found = lint_sources({"train.py": textwrap.dedent(_TRAIN).replace("SETUP", setup)})
    return [f.line for f in found if f.rule == "DDP008" and "warning" in f.message]


def test_a_warning_line_on_every_rank_is_reported_with_or_without_a_logging_set_up():
    assert _warnings("") == [21]
    assert _warnings("logging.basicConfig(level=logging.INFO)") == [21]


def test_a_warning_line_is_not_reported_where_logging_is_set_up_per_rank():
    per_rank = 'logging.basicConfig(level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.ERROR)'
    assert _warnings(per_rank) == []

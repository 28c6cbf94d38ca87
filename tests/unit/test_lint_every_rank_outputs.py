"""Output every rank repeats through tqdm's other front ends and through per-rank trackers (DDP008)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_RICH_BAR = """
    import torch.distributed as dist
    from tqdm.rich import tqdm_rich


    def train(loader):
        with tqdm_rich(total=len(loader), desc="epoch") as bar:
            for batch in loader:
                bar.update(1)


    dist.init_process_group("gloo")
    train(range(4))
    dist.destroy_process_group()
"""


def _lines(source: str, rule: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == rule]


def test_a_rich_tqdm_bar_on_every_rank_is_reported():
    assert _lines(_RICH_BAR, "DDP008") == [7]


def test_a_rich_tqdm_bar_disabled_off_rank_zero_is_not_reported():
    source = _RICH_BAR.replace('desc="epoch")', 'desc="epoch", disable=dist.get_rank() != 0)')
    assert _lines(source, "DDP008") == []


_WANDB = """
    import torch.distributed as dist
    import wandb


    def train_one_epoch(losses):
        for loss in losses:
            wandb.log({"batch_loss": loss})
        wandb.log({"epoch_loss": sum(losses)})


    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        wandb.init(project="demo")
    train_one_epoch([1.0, 2.0])
    dist.destroy_process_group()
"""


def test_wandb_log_on_every_rank_with_a_run_on_rank_zero_alone_is_reported_once_per_function():
    """The first log on a rank without a run raises, so the ones after it in the function never run there."""
    assert _lines(_WANDB, "DDP008") == [8]


def test_wandb_log_under_a_rank_check_or_a_run_test_or_with_a_run_on_every_rank_is_not_reported():
    guarded = _WANDB.replace('        wandb.log({"batch_loss": loss})', '        if dist.get_rank() == 0:\n'
                             '            wandb.log({"batch_loss": loss})').replace(
        '    wandb.log({"epoch_loss"', '    if wandb.run is not None:\n        wandb.log({"epoch_loss"')
    assert _lines(guarded, "DDP008") == []
    everywhere = _WANDB.replace('if dist.get_rank() == 0:\n        wandb.init(project="demo")',
                                'wandb.init(project="demo", group="ddp")')
    assert _lines(everywhere, "DDP008") == []


_WRITERS = """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter


    def record(writer, stats, epoch):
        for key in stats:
            writer.add_scalar(key, stats[key], epoch)
        writer.add_scalar("epoch", epoch, epoch)


    dist.init_process_group("gloo")
    writer = SummaryWriter("runs/demo")
    record(writer, {"lr": 0.1}, 0)
    dist.destroy_process_group()
"""


def test_a_summary_writer_every_rank_makes_on_one_folder_is_reported_where_it_is_made():
    # the line to fix is the writer's making (on rank 0 only); the message names the first record
    found = lint_sources({"train.py": textwrap.dedent(_WRITERS.replace("def record(writer,", "def record(").replace(
        "record(writer, {", "record({"))})
    assert [(f.line, "(line 8)" in f.message) for f in found if f.rule == "DDP008"] == [(13, True)]


_TRAINER_WRITER = """
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter


    class Trainer:
        def __init__(self, log_dir):
            self.writer = SummaryWriter(log_dir)

        def fit(self, epochs):
            for epoch in range(epochs):
                self.writer.add_scalar("train/lr", 0.1, epoch)

        def evaluate(self, epoch):
            self.writer.add_scalar("eval/acc", 1.0, epoch)


    dist.init_process_group("gloo")
    trainer = Trainer("runs/demo")
    trainer.fit(3)
    trainer.evaluate(3)
    dist.destroy_process_group()
"""


def test_a_writer_kept_on_the_object_is_one_finding_where_it_is_made():
    assert _lines(_TRAINER_WRITER, "DDP008") == [8]


def test_a_summary_writer_made_on_rank_zero_or_per_rank_is_not_reported():
    ranked = _WRITERS.replace('SummaryWriter("runs/demo")', 'SummaryWriter(f"runs/demo/{dist.get_rank()}")')
    assert _lines(ranked.replace("def record(writer,", "def record(").replace("record(writer, {", "record({"),
                  "DDP008") == []


_SWAP = """
    import builtins

    import torch.distributed as dist


    def quiet_off_rank_zero(is_master):
        builtin_print = builtins.print

        def gated(*args, **kwargs):
            force = kwargs.pop("force", False)
            force = force or (dist.get_world_size() > 8)
            if is_master or force:
                builtin_print(*args, **kwargs)

        builtins.print = gated


    dist.init_process_group("gloo")
    quiet_off_rank_zero(dist.get_rank() == 0)
    print("training")
    dist.destroy_process_group()
"""


def test_a_print_swap_that_lets_every_rank_through_on_a_world_size_test_is_reported_there():
    assert _lines(_SWAP, "DDP008") == [12]


def test_a_print_swap_gated_on_the_rank_alone_is_not_reported():
    assert _lines(_SWAP.replace("            force = force or (dist.get_world_size() > 8)\n", ""), "DDP008") == []


_WANDB_RUN_HANDED_ON = """
    import torch.distributed as dist
    import wandb


    class Trainer:
        def __init__(self, rank, run):
            self.rank = rank
            self.run = run

        def fit(self, losses):
            for loss in losses:
                if self.run is not None:
                    wandb.log({"loss": loss})


    dist.init_process_group("gloo")
    wandb_run = None
    if dist.get_rank() == 0:
        wandb_run = wandb.init(project="demo")
    Trainer(dist.get_rank(), wandb_run).fit([1.0, 2.0])
    dist.destroy_process_group()
"""


def test_wandb_log_under_a_test_of_the_run_handed_to_a_class_is_not_reported():
    """The run wandb.init returns on rank 0 (None elsewhere) reaches the log's test through a constructor."""
    assert _lines(_WANDB_RUN_HANDED_ON, "DDP008") == []
    untested = _WANDB_RUN_HANDED_ON.replace("if self.run is not None:", "if self.rank >= 0:")
    assert _lines(untested, "DDP008") == [14]

"""Mistakes the linter used to miss: lines written through a project's own logger, and figures that reach a report
through the program's own reporting helpers."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS as FIXTURES, check_program as _check


def test_a_project_logger_class_or_a_helper_returning_logging_repeats_on_every_rank():
    """`ConsoleLog(name).info(...)` (a class that keeps a console logger) and `plain_logging().info(...)` (a helper
    that sets up logging and returns the module): reported where the program logs, not inside the class."""
    _check("logger_wrappers")


_RANKED_LOGGER = """
    import logging
    import sys

    import torch.distributed as dist


    class ConsoleLog:
        def __init__(self, name, rank):
            self.inner = logging.getLogger(name)
            self.inner.addHandler(logging.StreamHandler(sys.stdout))
            self.inner.setLevel(logging.INFO if rank == 0 else logging.WARNING)

        def info(self, text):
            self.inner.info(text)


    dist.init_process_group("gloo")
    console = ConsoleLog("train", dist.get_rank())
    console.info("starting")
    dist.destroy_process_group()
"""


def test_a_logger_class_that_looks_at_the_rank_is_not_reported():
    assert [f for f in lint_sources({"train.py": textwrap.dedent(_RANKED_LOGGER)}) if f.rule == "DDP008"] == []


def test_a_library_network_with_batchnorm_has_buffers_ddp_broadcasts_in_a_rank0_forward():
    """`DDP(torchvision.models.shufflenet_v2_x1_0())` evaluated by a helper under no_grad on rank 0 alone: the
    buffer broadcast of that forward is a collective the other ranks never join (DDP010)."""
    _check("library_buffers")


def test_a_library_network_without_batchnorm_has_no_buffers_to_broadcast():
    source = (FIXTURES / "library_buffers" / "train.py").read_text().replace("shufflenet_v2_x1_0", "vit_b_16")
    assert [f for f in lint_sources({"train.py": source}) if f.rule == "DDP010"] == []


def test_a_print_swap_does_not_silence_a_tqdm_bar():
    """`builtins.print = gated` on ranks other than 0 keeps their prints off the console, but a tqdm bar writes to
    sys.stderr itself: the bar over the training batches is still drawn by every rank (DDP008)."""
    _check("print_swap_bar")


def test_a_rank_check_narrowed_by_and_and_a_helper_reading_the_module_ddp_model():
    """`if step % 10 == 0 and is_first:` lets rank 0 through alone: a `break` under it leaves the backpropagating loop
    on rank 0 only, and `held_out_loss()`, which runs the module's DDP model (with buffers) under no_grad without
    being handed it, makes a buffer broadcast there that the other ranks never join (DDP010)."""
    _check("narrowed_rank_checks")


def test_every_rank_writing_its_shard_figure_to_its_own_summary_writer():
    """`bar = tqdm(enumerate(loader))` over a sharded loader, then `board.add_scalar("train/loss", running)` where
    every rank made `board = SummaryWriter(...)`: each rank records its own shard's loss as the run's (DDP006)."""
    _check("every_rank_writer")


def test_a_reduced_epoch_figure_written_on_every_rank_is_not_reported():
    source = (FIXTURES / "every_rank_writer" / "train.py").read_text().replace(
        "        running /= i + 1\n",
        "        total = torch.tensor([running, i + 1.0])\n        dist.all_reduce(total)\n"
        "        running = (total[0] / total[1]).item()\n")
    assert "all_reduce" in source
    assert [f for f in lint_sources({"train.py": source}) if f.rule == "DDP006"] == []


_TWO_LINES = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        hits = 0
        seen = 0
        for x, y in loader:
            out = model(x)
            (out - y).pow(2).mean().backward()
            hits += int(((out > 0) == (y > 0)).sum())
            seen += len(y)
        if dist.get_rank() == 0:
            print("accuracy", hits / seen)
            print("correct", hits)
    dist.destroy_process_group()
"""


def test_one_shard_figure_finding_per_run_of_report_lines():
    """Two prints in a row of the same unreduced shard figures are one mistake, fixed by one reduction: one finding."""
    found = [f.line for f in lint_sources({"train.py": textwrap.dedent(_TWO_LINES)}) if f.rule == "DDP006"]
    assert found == [24]


def test_meters_handed_to_a_display_object_are_what_its_display_shows():
    """`board = Board(n, [loss_meter])` stores the meters on `self` and `board.show(i)` prints them: under a rank
    check, with no reduction anywhere, that is rank 0's own loss shown as the run's (DDP006)."""
    _check("display_object")


def test_memory_pinned_through_merged_loader_kwargs_counts_as_pinning():
    """`gpu_args = {"pin_memory": True}; loader_args.update(gpu_args); DataLoader(data, **loader_args)` pins memory:
    with NCCL and no set_device, the pinning thread works on cuda:0 on every rank (DDP012)."""
    _check("pinning_kwargs")
    source = (FIXTURES / "pinning_kwargs" / "train.py").read_text().replace('"pin_memory": True', '"pin_memory": False')
    assert [f for f in lint_sources({"train.py": source}) if f.rule == "DDP012"] == []


def test_a_distributed_sampler_subclass_seeded_by_epoch_needs_set_epoch():
    """`class GroupedSampler(DistributedSampler)` seeds its shuffle with `self.epoch`: never calling set_epoch
    repeats one order every epoch (DDP001); with `shuffle=False` the order is fixed on purpose."""
    _check("epoch_seeded_sampler")
    root = FIXTURES / "epoch_seeded_sampler"
    sources = {p.name: p.read_text() for p in root.glob("*.py")}
    sources["train.py"] = sources["train.py"].replace("shuffle=True", "shuffle=False")
    assert [f for f in lint_sources(sources) if f.rule == "DDP001"] == []


def test_a_trainer_in_another_file_given_the_wrapper_runs_the_modules_method():
    """`Trainer(ddp_model, ...)` keeps the wrapper as `self.model`; its step's `self.model.module.encode(x)` goes
    around it (DDP015), though the class never names DistributedDataParallel."""
    _check("trainer_given_wrapper")


def test_an_init_function_called_by_a_built_name_is_run():
    """`getattr(dist_utils, "init_dist_%s" % args.launcher)("nccl")`: every init_dist_* the name can spell may run, so
    their init_process_group makes a DDP program, with its DDP009 and DDP012 findings."""
    _check("init_by_built_name")


def test_a_wrap_that_does_not_sync_buffers_in_forward_starts_no_collective_in_a_rank0_no_grad_forward():
    """torch's newer spelling of broadcast_buffers=False, forward_sync_buffers=False: no buffer broadcast in forward."""
    source = (FIXTURES / "library_buffers" / "train.py").read_text().replace(
        "device_ids=[local])", "device_ids=[local], forward_sync_buffers=False)")
    assert "forward_sync_buffers=False" in source
    assert [f for f in lint_sources({"train.py": source}) if f.rule == "DDP010"] == []

"""Which ranks run a line: prints written before the call that swaps print off rank 0 run on every rank, and a
multiprocessing.Process doing background work (a writer fed by a queue) does not start ranks."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

from lint_markers import check_program as _check


def test_a_print_above_the_call_that_swaps_print_runs_on_every_rank():
    """run.py prints, then calls launch_utils.start_group, whose helper replaces builtins.print: the first print is
    every rank's; those after the call (and in functions called after it) are rank 0's alone."""
    _check("print_swap_order")


_MODULE_LEVEL_SWAP = """
    import builtins

    import torch.distributed as dist


    def hush(main):
        if not main:
            builtins.print = lambda *a, **k: None


    def join():
        dist.init_process_group("gloo")
        hush(dist.get_rank() == 0)


    print("booting")
    join()
    print("joined")
    dist.destroy_process_group()
"""


def test_module_code_above_the_swapping_call_is_reported_and_below_it_is_not():
    lines = [f.line for f in lint_sources({"boot.py": textwrap.dedent(_MODULE_LEVEL_SWAP)}) if f.rule == "DDP008"]
    assert lines == [17]


def test_a_background_writer_process_does_not_make_the_program_spawned():
    """recorder.py starts multiprocessing.Process workers that save arrays from a queue: the ranks come from the
    launcher of fit.py, so its --rank is the torch.distributed.launch contract and the recorder's prints and
    torch.save run on every rank."""
    _check("background_writers")


_PROCESS_RANKS = """
    import os

    import torch.distributed as dist
    from torch.multiprocessing import Process


    def work(rank, size):
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = "29500"
        dist.init_process_group("gloo", rank=rank, world_size=size)
        print("hello from", rank)
        dist.destroy_process_group()


    if __name__ == "__main__":
        procs = [Process(target=work, args=(r, 2)) for r in range(2)]
        for p in procs:
            p.start()
        print("started")
        for p in procs:
            p.join()
"""


def test_a_process_whose_target_joins_the_group_still_starts_ranks():
    found = [(f.rule, f.line) for f in lint_sources({"procs.py": textwrap.dedent(_PROCESS_RANKS)})
             if f.rule == "DDP008"]
    assert ("DDP008", 20) not in found  # (the parent prints once)


_EPOCH_COUNT = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    class Settings:
        n_epochs = 3


    def fit(cfg):
        dist.init_process_group("gloo")
        data = TensorDataset(torch.arange(40.0))
        order = DistributedSampler(data)
        loader = DataLoader(data, batch_size=4, sampler=order)
        for ep in range(1, cfg.n_epochs + 1):
            order.set_epoch(cfg.n_epochs)
            for (x,) in loader:
                pass
        for ep in range(cfg.n_epochs):
            cfg.n_epochs -= 0
            order.set_epoch(cfg.n_epochs)
        dist.destroy_process_group()


    fit(Settings())
"""


def test_set_epoch_given_the_loops_bound_passes_the_same_epoch_every_time():
    """`set_epoch(cfg.n_epochs)` inside `for ep in range(1, cfg.n_epochs + 1)`: the number of epochs, not the
    current one; a bound the loop itself assigns is not taken for a constant."""
    lines = [f.line for f in lint_sources({"fit.py": textwrap.dedent(_EPOCH_COUNT)}) if f.rule == "DDP001"]
    assert lines == [17]


_RANK_NONE_ARM = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel


    def fit(rank=None):
        if rank is not None:
            dist.init_process_group("nccl")
            torch.cuda.set_device(rank)
        net = torch.nn.Linear(4, 1).cuda()
        if rank is not None:
            net = DistributedDataParallel(net, device_ids=[rank])
        chief = rank is None or rank == 0
        for step in range(100):
            loss = net(torch.randn(8, 4).cuda()).pow(2).mean()
            loss.backward()
            if chief:
                print("step", step, "loss", loss.item())
        if rank == None or rank == 0:
            torch.save(net.state_dict(), "net.pt")
        if rank is not None:
            dist.destroy_process_group()
"""


def test_rank_is_none_is_the_single_process_arm_of_a_rank_check():
    """`rank is None or rank == 0`: None means no launcher gave a rank (one process), so in a launched
    run the test picks rank 0: its print is rank 0's own loss (DDP006), not every rank's output, and its save is
    guarded."""
    found = sorted((f.rule, f.line) for f in lint_sources({"fit.py": textwrap.dedent(_RANK_NONE_ARM)})
                   if f.rule in ("DDP004", "DDP006", "DDP008"))
    assert found == [("DDP006", 19)]


def test_a_logger_object_switched_on_for_rank_0_reports_its_shard_loss():
    """board.py's Board is built with `active=first` (rank 0): its methods test `self.active` (or an item of a dict
    each of whose items it set to `on and self.active`), so writing the step's loss through it is rank 0's loss as
    the run's; Tape exists on rank 0 only and takes the loss through `**named`. The loss's name cut from a setting
    (`"losses.py:mse".split(":")`) is text, not a figure."""
    _check("rank0_logger_objects")


_CHOSEN_DEVICE = """
    import torch
    import torch.distributed as dist


    def resume(args, model):
        if args.gpu is None:
            state = torch.load(args.resume)
        else:
            state = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
        model.load_state_dict(state)


    def main(args, model):
        dist.init_process_group("nccl")
        resume(args, model)
        print("total batch size", args.batch_size * (dist.get_world_size() if args.local_rank != -1 else 1))
        dist.destroy_process_group()
"""


def test_gpu_is_none_is_no_rank_check_and_a_rank_tested_for_a_factor_is_not_written_out():
    """`args.gpu is None` says no device was chosen, not that no launcher ran (unlike `rank is None`): the load
    under it still lacks map_location on every rank. A rank read only by the test of `x if local_rank != -1 else
    1` picks a factor of the total; the line does not say whose it is, so it repeats on every rank."""
    found = sorted((f.rule, f.line) for f in lint_sources({"resume.py": textwrap.dedent(_CHOSEN_DEVICE)})
                   if f.rule in ("DDP005", "DDP008"))
    assert found == [("DDP005", 8), ("DDP008", 17)]


_CALLED_BEFORE_SWAP = """
    import builtins

    import torch.distributed as dist


    def quiet(main):
        if not main:
            builtins.print = lambda *a, **k: None


    def setup():
        dist.init_process_group("gloo")
        quiet(dist.get_rank() == 0)


    def show_config(cfg):
        print("config", cfg)


    def show_done():
        print("done")


    def main(cfg):
        show_config(cfg)
        setup()
        show_done()
        dist.destroy_process_group()


    main({"lr": 0.1})
"""


def test_a_function_called_only_above_the_swapping_call_prints_on_every_rank():
    """main() calls show_config, then setup() (which swaps print), then show_done: show_config's print runs before
    the swap on every rank; show_done's runs after it."""
    lines = [f.line for f in lint_sources({"run.py": textwrap.dedent(_CALLED_BEFORE_SWAP)}) if f.rule == "DDP008"]
    assert lines == [18]

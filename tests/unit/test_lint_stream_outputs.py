"""Recall of the AG+AH round (DDP008): output every rank writes straight to sys.stdout (itself or through a helper
that writes its argument there), through a logger whose set-up reads the rank only to name its file, and in the
module code of a script the launcher starts as the ranks (which also starts helper processes of its own)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_WRITES = textwrap.dedent("""
    import sys

    import torch.distributed as dist

    from report import progress


    def train(steps):
        sys.stdout.write("starting\\n")
        for step in range(steps):
            progress(f"step {step}")
        if dist.get_rank() == 0:
            sys.stdout.write("done\\n")


    dist.init_process_group("gloo")
    train(4)
    dist.destroy_process_group()
""")

_REPORT = textwrap.dedent("""
    import sys


    def progress(msg=None):
        if msg is not None:
            sys.stdout.write(msg + "\\n")
            sys.stdout.flush()
""")


def test_writes_to_sys_stdout_on_every_rank_are_reported_where_the_text_is_chosen():
    found = [(f.path, f.line) for f in lint_sources({"train.py": _WRITES, "report.py": _REPORT})
             if f.rule == "DDP008"]
    assert found == [("train.py", 10), ("train.py", 12)]


_LOGGER = textwrap.dedent("""
    import logging


    def set_logger(rank=0):
        filepath = "./output/log.txt"
        if filepath is not None:
            if rank > 0:
                filepath = "%s-%i" % (filepath, rank)
            file_handler = logging.FileHandler(filepath, "a")
        console_handler = logging.StreamHandler()
        console_handler.setLevel(logging.INFO)
        logger = logging.getLogger()
        logger.setLevel(logging.DEBUG)
        if filepath is not None:
            logger.addHandler(file_handler)
        logger.addHandler(console_handler)
        return logger
""")

_LOGGED = textwrap.dedent("""
    import torch.distributed as dist

    from logs import set_logger


    def train():
        dist.init_process_group("nccl")
        logger = set_logger(rank=dist.get_rank())
        logger.info("start training")
        dist.destroy_process_group()


    if __name__ == "__main__":
        train()
""")


def test_a_logger_whose_set_up_reads_the_rank_only_for_its_file_logs_on_every_console():
    found = [f.line for f in lint_sources({"train.py": _LOGGED, "logs.py": _LOGGER}) if f.rule == "DDP008"]
    assert found == [10]


def test_a_logger_whose_console_level_is_chosen_by_the_rank_is_not_reported():
    per_rank = _LOGGER.replace("console_handler.setLevel(logging.INFO)",
                               "console_handler.setLevel(logging.INFO if rank == 0 else logging.WARNING)")
    assert [f.line for f in lint_sources({"train.py": _LOGGED, "logs.py": per_rank}) if f.rule == "DDP008"] == []


_FEEDER = textwrap.dedent("""
    import queue

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    dist.init_process_group("nccl", init_method="env://")
    batches = mp.Queue(8)


    def feed(worker):
        for number in range(1000):
            if number % dist.get_world_size() == dist.get_rank():
                batches.put(torch.randn(4, 4))


    for worker in range(2):
        mp.Process(target=feed, args=(worker,)).start()

    model = torch.nn.Linear(4, 4).cuda()
    print("model size", sum(p.numel() for p in model.parameters()))
    model = torch.nn.parallel.DistributedDataParallel(model)
""")


def test_module_code_of_a_launched_script_that_starts_feeder_processes_runs_on_every_rank():
    assert [f.line for f in lint_sources({"train.py": _FEEDER}) if f.rule == "DDP008"] == [22]

"""Precision by doubt: an every-rank finding whose path reads a per-rank value the guard reader left unresolved is
left out; a path every rank reads alike keeps its finding."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpkit.lint import lint_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"


def _found(name: str) -> set[tuple[int, str]]:
    return {(f.line, f.rule) for f in lint_source((FIXTURES / name).read_text(), name)}


def _line(name: str, needle: str) -> int:
    return next(i for i, line in enumerate((FIXTURES / name).read_text().splitlines(), 1) if needle in line)


def test_output_under_an_unresolved_device_index_test_is_not_reported():
    name = "bad_ddp004_doubtful_paths.py"
    found = _found(name)
    assert (_line(name, 'print("model built")'), "DDP008") not in found  # a flag computed from the device index


def test_branch_reached_only_through_the_rank_checked_call_is_not_reported():
    name = "bad_ddp004_doubtful_paths.py"
    found = _found(name)
    assert (_line(name, 'f"epoch{epoch}.pt"'), "DDP004") not in found
    assert (_line(name, 'print("kept a checkpoint'), "DDP008") not in found


def test_branch_every_rank_call_takes_is_still_reported():
    # the every-rank call passes final=True: that branch runs on every rank, whatever the rank-0 call passes; it is
    # reported at that call, where the rank check goes
    name = "bad_ddp004_doubtful_paths.py"
    assert (_line(name, "checkpoint(model, 3, final=True)"), "DDP004") in _found(name)


def test_conditions_every_rank_reads_alike_keep_their_findings():
    name = "bad_ddp008_paths_every_rank_reads_alike.py"
    found = _found(name)
    assert (_line(name, 'print("training on the given GPU")'), "DDP008") in found  # `args.gpu is not None`
    assert (_line(name, 'print("cuda is up")'), "DDP008") in found
    assert (_line(name, 'print("preparing data under"'), "DDP008") in found  # called on rank 0, then the others
    assert (_line(name, 'torch.save(model.state_dict(), "checkpoint.pth.tar")'), "DDP004") in found  # mode arm


def test_log_line_where_the_level_is_chosen_per_rank_by_an_unread_test():
    code = textwrap.dedent("""
        import logging
        import torch
        import torch.distributed as dist

        logging.basicConfig(level=logging.INFO)
        log = logging.getLogger("run")

        def main():
            dist.init_process_group("nccl")
            slot = torch.cuda.current_device()
            if slot % 8:
                log.setLevel(logging.ERROR)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
            log.info("model ready")
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """)
    assert not [f for f in lint_source(code, "train.py") if f.rule == "DDP008"]


def test_output_after_a_call_on_an_object_only_some_ranks_hold():
    # the other ranks hold None and raise at `self.sink.flush()`: only the rank that made the sink prints
    code = textwrap.dedent("""
        import torch
        import torch.distributed as dist

        class Board:
            def __init__(self, rank, path):
                self.sink = None
                if rank == 0:
                    self.sink = open(path, "w")

            def finish(self):
                self.sink.flush()
                print("board closed")

        def main():
            dist.init_process_group("nccl")
            rank = dist.get_rank()
            torch.cuda.set_device(rank)
            board = Board(rank, "log.txt")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda(), device_ids=[rank])
            board.finish()
            print("run over")
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """)
    lines = [f.line for f in lint_source(code, "train.py") if f.rule == "DDP008"]
    at = {text.strip(): i for i, text in enumerate(code.splitlines(), 1)}
    assert at['print("board closed")'] not in lines
    assert at['print("run over")'] in lines

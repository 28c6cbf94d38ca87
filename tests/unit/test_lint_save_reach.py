"""Recall of the AC+AD round (DDP004): a save branch of a helper reached only by the calls that pass its flag, and a
guard on the global rank modulo the GPUs of one machine (rank 0 of every node)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_FLAGGED = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist


    def save_checkpoint(state, epoch, final=False):
        if final:
            torch.save(state, "last.pth")
        else:
            print("skipped", epoch)


    def main():
        dist.init_process_group("nccl")
        model = torch.nn.Linear(4, 1)
        for epoch in range(3):
            if dist.get_rank() == 0:
                save_checkpoint(model.state_dict(), epoch)
        save_checkpoint(model.state_dict(), "last", final=True)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def _saves(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.severity) for f in lint_sources({"train.py": source}) if f.rule == "DDP004"]


def test_the_unguarded_call_that_passes_the_save_flag_is_reported():
    """`save_checkpoint(..., final=True)` after the loop with no rank check reaches the `if final:` save on every
    rank; the guarded calls pass the default and never reach it."""
    line = _FLAGGED.splitlines().index('    save_checkpoint(model.state_dict(), "last", final=True)') + 1
    assert _saves(_FLAGGED) == [(line, "error")]


def test_a_flag_no_unguarded_call_sets_reaches_no_save():
    last = '    save_checkpoint(model.state_dict(), "last", final=True)\n'
    guarded = _FLAGGED.replace(last, "    if dist.get_rank() == 0:\n    " + last)
    assert _saves(guarded) == []
    assert _saves(_FLAGGED.replace('"last", final=True)', '"last", final=False)')) == []


def test_a_flag_passed_as_a_value_not_known_leaves_the_finding_in_the_helper():
    unknown = _FLAGGED.replace('"last", final=True)', '"last", final=os.environ.get("FINAL"))')
    assert _saves(unknown) == [(_FLAGGED.splitlines().index('        torch.save(state, "last.pth")') + 1, "error")]


_PER_NODE = textwrap.dedent("""
    import argparse

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(gpu, ngpus_per_node, args):
        rank = args.node_rank * ngpus_per_node + gpu
        dist.init_process_group("nccl", init_method=args.dist_url, world_size=args.world_size, rank=rank)
        model = torch.nn.Linear(4, 1).cuda(gpu)
        if rank % ngpus_per_node == 0:
            torch.save(model.state_dict(), "model.pth")
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--world-size", type=int, default=1, help="number of nodes")
        parser.add_argument("--node-rank", type=int, default=0)
        parser.add_argument("--dist-url", default="tcp://10.0.0.1:23456")
        args = parser.parse_args()
        ngpus_per_node = torch.cuda.device_count()
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
""")


def test_the_global_rank_modulo_the_gpus_of_a_machine_is_a_local_rank_check():
    line = _PER_NODE.splitlines().index('        torch.save(model.state_dict(), "model.pth")') + 1
    assert _saves(_PER_NODE) == [(line, "warning")]
    assert _saves(_PER_NODE.replace("rank % ngpus_per_node == 0", "rank == 0")) == []

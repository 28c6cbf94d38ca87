"""False alarms of `ddpkit lint` on shapes real scripts take, each beside the real mistake it must still report."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_source, lint_sources


def _lint(code: str, rule: str) -> list[int]:
    """Lines of `code` where `rule` fires."""
    return [f.line for f in lint_source(textwrap.dedent(code), "train.py") if f.rule == rule]


def _line(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


def _lint_files(files: dict[str, str], rule: str) -> set[tuple[str, int]]:
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, f.line) for f in lint_sources(sources) if f.rule == rule}


# ---- which process runs the code -----------------------------------------------------------------
SPAWN_WITH_FALLBACK = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def train(rank, cfg):
        if cfg.num_gpus > 1:
            dist.init_process_group("nccl", rank=rank, world_size=cfg.num_gpus)
        print("starting epoch")
        dist.destroy_process_group()

    def main(cfg):
        print("preparing the run")
        if cfg.num_gpus > 1:
            mp.spawn(train, nprocs=cfg.num_gpus, args=(cfg,))
        else:
            train(0, cfg)

    if __name__ == "__main__":
        main(None)
"""


def test_spawn_parent_with_single_process_fallback_is_not_a_rank():
    # `else: train(0, cfg)` runs the worker as one process with a fixed rank: main() stays the parent
    lines = _lint(SPAWN_WITH_FALLBACK, "DDP008")
    assert _line(SPAWN_WITH_FALLBACK, "preparing the run") not in lines
    assert lines == [_line(SPAWN_WITH_FALLBACK, "starting epoch")]  # the worker's own print still counts


def test_worker_called_with_a_rank_variable_still_makes_the_caller_a_rank():
    # the ImageNet example's two modes: `main_worker(args.gpu, ...)` is what torchrun runs on every rank
    code = SPAWN_WITH_FALLBACK.replace("train(0, cfg)", "train(cfg.gpu, cfg)")
    assert _line(code, "preparing the run") in _lint(code, "DDP008")

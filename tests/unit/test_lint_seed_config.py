"""DDP014: a transformers model built from a config that keeps its architecture's default dropout, and which of
a function's seedings (`torch.manual_seed`, then the CUDA ones) the finding names."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from transformers import GPT2Config, GPT2LMHeadModel


    def run(rank, settings):
        dist.init_process_group("nccl", rank=rank, world_size=2)
        torch.manual_seed(1234)
        torch.cuda.manual_seed_all(1234)
        config = CONFIG
        model = GPT2LMHeadModel(config).cuda(rank)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        for step in range(10):
            model(torch.ones(2, 4).long().cuda(rank)).logits.sum().backward()


    if __name__ == "__main__":
        mp.spawn(run, args=({},), nprocs=2)
""")


def _seed_lines(config: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": _TRAIN.replace("CONFIG", config)}) if f.rule == "DDP014"]


def test_a_model_built_from_a_config_with_default_dropout_draws_the_same_masks_at_the_cpu_seed():
    assert _seed_lines("GPT2Config(vocab_size=51200)") == [10]


def test_a_config_that_sets_or_may_set_its_dropout_is_not_sure():
    assert _seed_lines("GPT2Config(vocab_size=51200, resid_pdrop=0.0)") == []
    assert _seed_lines("GPT2Config(**settings)") == []
    assert _seed_lines("settings") == []
    # a config class of another kind (the program's own) says nothing of the rates GPT2LMHeadModel reads
    assert _seed_lines("ModelConfig(vocab_size=51200)") == []

"""DDP015: a training step that calls `(model if single else model.module).f(...)` of a wrapped model runs the
`.module` arm under DDP (the wrapper has none of the module's methods), around the wrapper."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch
    import torch.distributed as dist


    def train(rank, n_gpus, model, loader, scaler, fp16):
        dist.init_process_group("nccl", rank=rank, world_size=n_gpus)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        for x in loader:
            if fp16:
                with torch.cuda.amp.autocast():
                    loss = (CHOICE).compute_loss(x)
                scaler.scale(loss).backward()
            else:
                loss = (CHOICE).compute_loss(x)
                loss.backward()
        dist.destroy_process_group()
""")


def _bypass_lines(choice: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": _TRAIN.replace("CHOICE", choice)}) if f.rule == "DDP015"]


def test_the_module_arm_of_a_choice_runs_around_the_wrapper_in_each_branch():
    assert _bypass_lines("model if n_gpus == 1 else model.module") == [12, 15]
    assert _bypass_lines("model.module if n_gpus > 1 else model") == [12, 15]


def test_a_choice_between_other_models_is_not_the_wrapped_module():
    assert _bypass_lines("model if n_gpus == 1 else scaler.module") == []

"""DDP007 for absl's `flags.DEFINE_integer("local_rank", 0, ...)`: the torch.distributed.launch contract through
absl, which torchrun never fills, so every rank keeps the default."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_PROGRAM = '''import torch
import torch.distributed as dist
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("local_rank", 0, "rank of the GPU used")


def main(argv):
    dist.init_process_group("nccl")
    torch.cuda.set_device(FLAGS.local_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    app.run(main)
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP007"]


def test_an_absl_local_rank_flag_is_the_old_launchers_contract():
    assert _lines(_PROGRAM) == [6]


def test_a_flag_that_defaults_to_local_rank_or_another_flag_is_no_finding():
    assert _lines(_PROGRAM.replace('"local_rank", 0,', '"local_rank", int(os.environ["LOCAL_RANK"]),')) == []
    assert _lines(_PROGRAM.replace('"local_rank", 0,', '"num_gpus", 0,').replace("FLAGS.local_rank", "0")) == []

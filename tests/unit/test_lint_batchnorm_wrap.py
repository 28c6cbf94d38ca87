"""DDP013 where no file of the program names BatchNorm but the model surely holds it: a library network of a
BatchNorm architecture, or a model the program switches to SyncBatchNorm only behind a flag that is off by default
(reported where the model is wrapped)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def _notes(name: str, old: str = "", new: str = "") -> list[int]:
    source = (PROGRAMS / name / "train.py").read_text().replace(old, new)
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP013"]


def test_a_model_built_with_sync_bn_off_by_default_is_reported_where_it_is_wrapped():
    check_program("batchnorm_flag")


def test_a_library_network_of_a_batchnorm_architecture_is_reported_where_it_is_wrapped():
    check_program("batchnorm_library")


def test_a_sync_bn_switch_that_is_on_by_default_is_no_finding():
    assert _notes("batchnorm_flag", 'action="store_true"', 'action="store_false"') == []
    assert _notes("batchnorm_library", "if args.sync_bn:", "if True:") == []


def test_a_library_network_without_batchnorm_or_a_model_of_unknown_make_is_no_finding():
    assert _notes("batchnorm_library", "resnet50", "vit_b_16") == []
    assert _notes("batchnorm_flag", "sync_bn=True if args.sync_bn else False", "depth=2") == []


def test_a_flag_switch_on_a_model_class_of_the_program_without_batchnorm_is_no_finding():
    """The class is in the files linted and names no BatchNorm: the switch has nothing to convert."""
    own = "from torch import nn\n\n\nclass Detector(nn.Module):\n    def __init__(self, width, sync_bn=False):\n" \
          "        super().__init__()\n        self.body = nn.Sequential(nn.Conv2d(3, width, 3), nn.LayerNorm(width))\n"
    source = (PROGRAMS / "batchnorm_flag" / "train.py").read_text()
    found = lint_sources({"train.py": source, "detector.py": own})
    assert [f for f in found if f.rule == "DDP013"] == []


_PROCESSOR = '''import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from utils import import_class, str2bool


class Processor:
    def __init__(self, arg):
        self.arg = arg
        self.load_model()
        self.wrap()

    def load_model(self):
        Model = import_class(self.arg.model)
        if self.arg.sync_bn:
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(Model())
        else:
            self.model = Model()

    def wrap(self):
        local_rank = int(os.environ["LOCAL_RANK"])
        self.model = self.model.to(local_rank)
        self.model = DDP(self.model, device_ids=[local_rank])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="net.Net")
    parser.add_argument("--sync-bn", default=False, type=str2bool, help="use SyncBatchNorm")
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    Processor(parser.parse_args())
'''


def test_a_model_kept_on_self_and_switched_by_a_boolean_flag_off_by_default_is_reported_where_it_is_wrapped():
    """`self.model` is built in one method (converted only behind `--sync-bn`, `default=False, type=str2bool`) and
    wrapped in another."""
    assert [f.line for f in lint_sources({"train.py": _PROCESSOR}) if f.rule == "DDP013"] == [27]
    flag = _PROCESSOR.replace("default=False, type=str2bool", 'action="store_true"')
    assert [f.line for f in lint_sources({"train.py": flag}) if f.rule == "DDP013"] == [27]


def test_a_boolean_flag_on_by_default_or_a_flag_of_another_type_is_no_finding():
    on = _PROCESSOR.replace("default=False, type=str2bool", "default=True, type=str2bool")
    assert [f for f in lint_sources({"train.py": on}) if f.rule == "DDP013"] == []
    text = _PROCESSOR.replace("default=False, type=str2bool", "default=False, type=int")
    assert [f for f in lint_sources({"train.py": text}) if f.rule == "DDP013"] == []

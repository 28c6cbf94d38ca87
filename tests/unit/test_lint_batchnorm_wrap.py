"""DDP013 where no file of the program names BatchNorm but the model surely holds it: a library network of a
BatchNorm architecture, or a model the program switches to SyncBatchNorm only behind a flag that is off by default
(reported where the model is wrapped)."""

from __future__ import annotations

import textwrap

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


_NETS = '''from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(width, width, 3), nn.BatchNorm2d(width), nn.ReLU())


class Net(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(16) for _ in range(depth)])


def Net18():
    return Net(18)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 10)
'''

_TRAINER = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from nets import Head, Net18


class Trainer:
    def __init__(self, model, head, rank):
        self.model = DDP(model.to(rank), device_ids=[rank])
        self.head = DDP(head.to(rank), device_ids=[rank])


def build():
    model = Net18()
    return model, Head()


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model, head = build()
    Trainer(model, head, rank)
'''


def test_a_model_of_the_programs_batchnorm_classes_handed_to_a_trainer_is_reported_where_it_is_wrapped():
    """Net18() builds Net, whose Block names BatchNorm2d: the trainer's wrap of it is the line to fix, not the
    BatchNorm2d; the head, which holds none, is no finding."""
    found = [(f.path, f.line) for f in lint_sources({"train.py": _TRAINER, "nets.py": _NETS}) if f.rule == "DDP013"]
    assert found == [("train.py", 12)]


def test_a_model_whose_make_is_not_followed_is_reported_at_the_batchnorm_it_names():
    source = _TRAINER.replace("    model, head = build()\n", "    model, head = make_models()\n")
    found = [(f.path, f.line) for f in lint_sources({"train.py": source, "nets.py": _NETS}) if f.rule == "DDP013"]
    assert found == [("nets.py", 7)]


_WRAPPER_CLASS = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchvision.models import BACKBONE


    class Classifier(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.backbone = BACKBONE(weights=None)
            self.backbone.fc = nn.Linear(self.backbone.fc.in_features, num_classes)

        def forward(self, x):
            return self.backbone(x)


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = Classifier(10)
        model = nn.parallel.DistributedDataParallel(model.to(rank), device_ids=[rank])
        model(torch.randn(2, 3, 224, 224).to(rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def test_a_class_of_the_program_around_a_library_batchnorm_network_is_reported_where_it_is_wrapped():
    def notes(backbone: str) -> list[int]:
        source = _WRAPPER_CLASS.replace("BACKBONE", backbone)
        return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP013"]

    assert notes("resnet50") == [22]
    assert notes("vit_b_16") == []


def test_a_timm_model_made_through_a_submodule_of_timm_is_of_unknown_make():
    """`from timm.models import create_model` is `timm.create_model` under another path: the network its name
    picks is not known to hold BatchNorm (a ViT's norm layers are LayerNorm), so the off-by-default switch is no
    finding, as for `timm.create_model` itself."""
    for imported in ("from timm.models import create_model", "from timm.models.factory import create_model"):
        source = (PROGRAMS / "batchnorm_library" / "train.py").read_text().replace(
            "import torchvision\n", imported + "\n").replace("torchvision.models.resnet50(num_classes=10)",
                                                             'create_model("vit_small", num_classes=10)')
        assert [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP013"] == []


_BLOCK_NETS = '''from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)


class Plain(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)


class Backbone(nn.Module):
    def __init__(self, block, counts):
        super().__init__()
        self.stages = nn.Sequential(*[self._stage(block, n) for n in counts])

    def _stage(self, block, n):
        return nn.Sequential(*[block(64) for _ in range(n)])


def backbone50(**kwargs):
    return Backbone(BLOCK, [3, 4, 6, 3], **kwargs)
'''

_BLOCK_TRAIN = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from blocks import backbone50


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model = backbone50().to(rank)
    model = DDP(model, device_ids=[rank])
    model(torch.randn(2, 64, 8, 8).to(rank)).sum().backward()


if __name__ == "__main__":
    main()
'''


def test_a_block_class_handed_to_the_programs_network_is_reported_where_it_is_wrapped():
    """Backbone(Bottleneck, [3, 4, 6, 3]) builds its stages from the block class it is handed, the way ResNet
    implementations do: the BatchNorm of Bottleneck is in the wrapped model, so the note goes to the DDP call; a
    block without BatchNorm handed the same way makes the model hold none (and leaves Bottleneck unbuilt)."""
    def notes(block: str) -> list[tuple[str, int]]:
        nets = _BLOCK_NETS.replace("BLOCK", block)
        return [(f.path, f.line) for f in lint_sources({"train.py": _BLOCK_TRAIN, "blocks.py": nets})
                if f.rule == "DDP013"]

    assert notes("Bottleneck") == [("train.py", 15)]
    assert notes("Plain") == []


_GAN_NETS = '''from torch import nn


class Generator(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.ConvTranspose2d(cfg.nz, 64, 4), nn.BatchNorm2d(64), nn.ReLU())


class Plain(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.ConvTranspose2d(cfg.nz, 64, 4), nn.ReLU())
'''

_SETUP = '''import torch
from torch import nn


class TrainConfig:
    nz = 100

    def get_network(self, network, device_rank=0):
        net = network(self).to(device_rank)
        net = nn.parallel.DistributedDataParallel(net, device_ids=[device_rank])
        return net, torch.optim.Adam(net.parameters())
'''

_GAN_TRAIN = '''import os

import torch.distributed as dist

from nets import NET
from setup import TrainConfig


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    cfg = TrainConfig()
    net, opt = cfg.get_network(NET, device_rank=rank)


if __name__ == "__main__":
    main()
'''


def test_a_class_handed_to_another_files_method_that_builds_and_wraps_it_is_reported_at_the_wrap():
    """`cfg.get_network(Generator)` where get_network builds `network(self)` and wraps it in DDP: the model is the
    class its callers pass for that parameter; a class without BatchNorm passed the same way is no finding."""
    def notes(net: str) -> list[tuple[str, int]]:
        files = {"train.py": _GAN_TRAIN.replace("NET", net), "nets.py": _GAN_NETS, "setup.py": _SETUP}
        return [(f.path, f.line) for f in lint_sources(files) if f.rule == "DDP013"]

    assert notes("Generator") == [("setup.py", 10)]
    assert notes("Plain") == []

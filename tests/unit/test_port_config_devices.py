"""A device a project picks in a config module the script imports at run time (`module = import_module(name)`,
then `module.device`): each rank's own device after the port, as `args.device` is."""

from __future__ import annotations

from ddpkit.port import port_source

SCRIPT = '''\
import argparse
from importlib import import_module

import torch


class Trainer:
    def __init__(self, device, model, optimizer):
        self.device = device
        self.model = model.to(device)
        self.optimizer = optimizer

    def step(self, x):
        self.optimizer.zero_grad()
        self.model(x.to(self.device)).sum().backward()
        self.optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    args = parser.parse_args()
    {bind}
    trainer = Trainer(cfg_module.device, cfg_module.model, cfg_module.optimizer)
    print(f"device: {{cfg_module.device}}")
    for x in cfg_module.batches:
        trainer.step(x)
'''


def _port(bind: str) -> str:
    return port_source(SCRIPT.format(bind=bind), "classifier.py").code


def test_the_device_of_a_config_module_imported_at_run_time_is_each_ranks_own():
    for bind in ("cfg_module = import_module(args.config)", "import importlib; cfg_module = importlib.import_module("
                 "args.config)", "cfg_module = __import__(args.config)"):
        code = _port(bind)
        assert "trainer = Trainer(ctx.device, cfg_module.model, cfg_module.optimizer)" in code, code
        assert 'f"device: {ctx.device}"' in code and "cfg_module.device" not in code


def test_a_device_attribute_of_an_object_the_script_builds_is_left_alone():
    code = _port("cfg_module = argparse.Namespace(device='cuda:0', model=None, optimizer=None, batches=[])")
    assert "Trainer(cfg_module.device, cfg_module.model, cfg_module.optimizer)" in code


BASIC = '''\
import os
import torch


class ExpBase:
    def __init__(self, args):
        self.args = args
        self.device = self._acquire_device()
        self.model = self._build_model().to(self.device)

    def _acquire_device(self):
        if self.args.use_gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(self.args.gpu)
            return torch.device("cuda:{}".format(self.args.gpu))
        return torch.device("cpu")
'''

EXP = '''\
import torch
from exp.base import ExpBase


class Exp(ExpBase):
    def __init__(self, args):
        super().__init__(args)

    def _build_model(self):
        return torch.nn.Linear(4, 2)

    def train(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            self.model(torch.randn(8, 4, device=self.device)).sum().backward()
            opt.step()
'''

RUN = '''\
import argparse
from exp.main import Exp

parser = argparse.ArgumentParser()
parser.add_argument("--use_gpu", type=bool, default=True)
parser.add_argument("--gpu", type=int, default=0)
args = parser.parse_args()
exp = Exp(args)
exp.train()
'''


def test_a_gpu_the_projects_base_class_picks_for_the_config_it_gets_is_named_with_its_line(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "__init__.py").write_text("")
    (tmp_path / "exp" / "base.py").write_text(BASIC)
    (tmp_path / "exp" / "main.py").write_text(EXP)
    script = tmp_path / "run.py"
    script.write_text(RUN)
    messages = [t.message for t in port_source(RUN, str(script)).todos]
    picked = [m for m in messages if "base.py:14 `torch.device('cuda:{}'.format(self.args.gpu))` chooses a device of its "
              "own" in m]
    assert picked and "CUDA_VISIBLE_DEVICES" not in picked[0], messages  # after ddpkit.init it changes nothing


def test_the_device_of_a_settings_module_read_through_an_alias_is_each_ranks_own(tmp_path):
    # settings.py picks cuda:0; `S.device` in the script is its device setting, as `args.device` is
    (tmp_path / "settings.py").write_text("import torch\ndevice = torch.device('cuda:0' if torch.cuda.is_available() "
                                          "else 'cpu')\nlr = 0.1\n")
    (tmp_path / "hp.py").write_text("import torch\n\n\nclass C:\n    device = torch.device('cuda:0')\n    lr = 0.1\n")
    (tmp_path / "other.py").write_text("lr = 0.1\n")
    body = ("import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n{imp}\n\n"
            "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(ds, batch_size=64, shuffle=True)\nfor x, y in loader:\n"
            "    noise = torch.randn(x.shape, device=S.device)\n    loss = ((model(x + noise) - y) ** 2).mean()\n"
            "    loss.backward()\n    opt.step()\n")
    for imp in ("import settings as S", "from hp import C as S"):
        source = body.format(imp=imp)
        (tmp_path / "train.py").write_text(source)
        result = port_source(source, str(tmp_path / "train.py"))
        assert "device=ctx.device" in result.code and "S.device" not in result.code, result.code
    # a module of the project that sets no device: `S.device` is something else, left as it is
    source = body.format(imp="import other as S")
    (tmp_path / "train.py").write_text(source)
    assert "device=S.device" in port_source(source, str(tmp_path / "train.py")).code

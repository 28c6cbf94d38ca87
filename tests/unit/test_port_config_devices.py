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

"""`ddpkit port`: a copy of the wrapped model built beside it (a target network) goes to ctx.device with it."""

from __future__ import annotations

from ddpkit.port import port_source

TARGET_NETWORK = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class QNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


if __name__ == "__main__":
    data = torch.randn(64, 4)
    loader = DataLoader(data, batch_size=8)
    online = QNet()
    target = QNet()
    target.load_state_dict(online.state_dict())
    opt = torch.optim.SGD(online.parameters(), lr=0.1)
    for x in loader:
        nxt = torch.randn(8, 4)
        with torch.no_grad():
            goal = target(nxt).max(1)[0]
            also = target(x).max(1)[0]
        loss = (online(x).max(1)[0] - goal - also).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mixed = {k: 0.99 * v + 0.01 * online.state_dict()[k] for k, v in target.state_dict().items()}
        target.load_state_dict(mixed)
'''


def test_a_target_network_built_beside_the_wrapped_model_goes_to_ctx_device_with_its_inputs():
    code = port_source(TARGET_NETWORK).code
    assert "online = ddpkit.wrap(online, ctx)" in code
    assert "target = QNet().to(ctx.device)\n" in code
    assert "goal = target(nxt.to(ctx.device)).max(1)[0]" in code  # a CPU tensor the script made
    assert "also = target(ddpkit.device.to_device(x, ctx.device)).max(1)[0]" in code  # a batch: moved if on the CPU
    assert "import ddpkit.device\n" in code


def test_a_module_of_another_kind_or_one_the_script_moves_itself_is_left_alone():
    other = TARGET_NETWORK.replace("    target = QNet()\n", "    target = nn.Linear(4, 2)\n").replace(
        "    target.load_state_dict(online.state_dict())\n", "")
    assert "target = nn.Linear(4, 2)\n" in port_source(other).code  # nothing says it meets the model
    moved = TARGET_NETWORK.replace("    target = QNet()\n", "    target = QNet()\n    target.to('cpu')\n")
    assert "target = QNet()\n" in port_source(moved).code

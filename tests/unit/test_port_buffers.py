"""`ddpkit port` on models that store what their inputs computed into a registered buffer (a queue, a memory bank)."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source

_SCRIPT = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Queued(nn.Module):
        def __init__(self, k=64):
            super().__init__()
            self.enc = nn.Linear(4, 8)
            self.register_buffer("queue", torch.randn(8, k))
            self.register_buffer("ptr", torch.zeros(1, dtype=torch.long))

        @torch.no_grad()
        def _enqueue(self, keys):
            p = int(self.ptr)
            self.queue[:, p:p + keys.shape[0]] = keys.t()
            self.ptr[0] = (p + keys.shape[0]) % self.queue.shape[1]

        def forward(self, x):
            z = self.enc(x)
            loss = (z @ self.queue).logsumexp(1).mean()
            self._enqueue(z.detach())
            return loss


    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=32, shuffle=True)
    model = Queued()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        loss = model(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _todos(tmp_path, source: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return [t.message for t in port_source(script.read_text(), str(script)).todos]


def test_a_buffer_the_model_fills_from_its_inputs_is_a_todo_at_the_wrap(tmp_path):
    found = [t for t in _todos(tmp_path, _SCRIPT) if "registered buffer" in t]
    assert len(found) == 1 and "`Queued` stores values computed from its inputs into its registered buffer `queue` " \
        "in `_enqueue`" in found[0] and "broadcast_buffers=False" in found[0] and "all_gather" in found[0], found


def test_a_running_statistic_a_gathered_queue_and_a_constant_store_are_no_todo(tmp_path):
    # a running mean updated as a whole (BatchNorm's kind of buffer): DDP keeping rank 0's is its usual behaviour
    stat = _SCRIPT.replace("self.queue[:, p:p + keys.shape[0]] = keys.t()",
                           "self.queue.mul_(0.9).add_(0.1 * keys.mean(0)[:, None])")
    assert not [t for t in _todos(tmp_path, stat) if "registered buffer" in t]
    # the class gathers the keys of every rank itself before storing them
    gathered = _SCRIPT.replace("self.queue[:, p:p + keys.shape[0]] = keys.t()",
                               "keys = concat_all_gather(keys)\n            "
                               "self.queue[:, p:p + keys.shape[0]] = keys.t()")
    assert not [t for t in _todos(tmp_path, gathered) if "registered buffer" in t]
    # a store of a constant (a reset), not of anything the inputs computed
    reset = _SCRIPT.replace("self.queue[:, p:p + keys.shape[0]] = keys.t()", "self.queue[:, p] = 0.0")
    assert not [t for t in _todos(tmp_path, reset) if "registered buffer" in t]

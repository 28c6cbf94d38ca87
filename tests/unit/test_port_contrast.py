"""`ddpkit port` on training losses that compare the samples of a batch with each other (contrastive losses)."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source

_SCRIPT = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    from losses import PairLoss

    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=32, shuffle=True)
    model = nn.Linear(4, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = PairLoss().cuda()  # moved: the class is still the one the loss comes from
    for (x,) in loader:
        z = model(torch.cat([x, x + 0.1 * torch.randn_like(x)]))
        loss = criterion(z)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _todos(tmp_path, loss_forward: str) -> list[str]:
    (tmp_path / "losses.py").write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                                        "class PairLoss(nn.Module):\n    def forward(self, z):\n" +
                                        textwrap.indent(textwrap.dedent(loss_forward), " " * 8))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    return [t.message for t in port_source(script.read_text(), str(script)).todos]


def test_a_project_loss_over_a_similarity_matrix_of_the_batch_is_a_todo(tmp_path):
    todos = _todos(tmp_path, """\
        z = F.normalize(z, dim=1)
        sim = torch.mm(z, z.t()) / 0.5
        labels = torch.arange(z.shape[0]).roll(z.shape[0] // 2)
        return F.cross_entropy(sim - 1e9 * torch.eye(z.shape[0]), labels)
    """)
    found = [t for t in todos if "compares the samples of a batch" in t]
    assert len(found) == 1 and "losses.py:9 `torch.mm(z, z.t())`" in found[0] and "all_gather" in found[0], todos


def test_matmul_operator_and_pairwise_cosine_are_comparisons_too(tmp_path):
    todos = _todos(tmp_path, "a, b = z.chunk(2)\nreturn -(a @ b.T).diag().mean()\n")
    assert any("`a @ b.T`" in t for t in todos), todos
    todos = _todos(tmp_path, "s = F.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=2)\nreturn s.mean()\n")
    assert any("compares the samples of a batch" in t for t in todos), todos


def test_a_per_sample_loss_and_an_attention_transpose_are_not_comparisons(tmp_path):
    # BYOL's loss: the cosine between two views of each sample, no other sample involved
    todos = _todos(tmp_path, "a, b = F.normalize(z, dim=-1).chunk(2)\nreturn (2 - 2 * (a * b).sum(-1)).mean()\n")
    assert not [t for t in todos if "compares the samples" in t], todos
    todos = _todos(tmp_path, "q = z.view(z.shape[0], 2, 4)\nw = torch.matmul(q, q.transpose(-2, -1))\n"
                             "return w.mean()\n")
    assert not [t for t in todos if "compares the samples" in t], todos


def test_a_contrastive_loss_defined_in_the_script_is_a_todo(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT).replace("from losses import PairLoss\n", "").replace(
        "loader = ", "def info_nce(z):\n    a, b = z.chunk(2)\n    return -torch.log_softmax(a @ b.t(), 1).diag()"
        ".mean()\n\n\nloader = ").replace("criterion = PairLoss()\n", "criterion = info_nce\n").replace(
        "loss = criterion(z)", "loss = info_nce(z)"))
    todos = [t.message for t in port_source(script.read_text(), str(script)).todos]
    assert any("from `info_nce`, which compares the samples" in t for t in todos), todos


def test_a_product_with_the_modules_own_proxies_compares_no_samples(tmp_path):
    # a proxy loss scores each sample against learned class proxies: no other sample of the batch is involved
    todos = _todos(tmp_path, "self.proxies = torch.zeros(3, 8)\nreturn (z @ self.proxies.t()).logsumexp(1).mean()\n")
    assert not [t for t in todos if "compares the samples" in t], todos


_HANDED = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    from losses import PairLoss
    from trainer import train

    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=32, shuffle=True)
    model = nn.Linear(4, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _handed(tmp_path, loss: str, trainer: str, calls: str) -> list[str]:
    """TODOs of a script that builds `PairLoss` (forward returning `loss`) and hands it to trainer.py's `train`."""
    (tmp_path / "losses.py").write_text("import torch\nimport torch.nn as nn\n\n\nclass PairLoss(nn.Module):\n"
                                        f"    def forward(self, a, b):\n        return {loss}\n")
    (tmp_path / "trainer.py").write_text(trainer)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_HANDED) + calls)
    return [t.message for t in port_source(script.read_text(), str(script)).todos]


def test_a_contrastive_loss_handed_to_the_projects_training_function_is_a_todo(tmp_path):
    # the backward() is in trainer.py (read, not ported): the loss the script builds and hands over still trains there
    todos = _handed(tmp_path, "-(a @ b.T).diag().mean()",
                    "def step(model, x, criterion, optimizer):\n    z = model(x)\n    loss = criterion(z, z)\n"
                    "    loss.backward()\n    optimizer.step()\n\n\ndef train(model, loader, criterion, optimizer):\n"
                    "    for (x,) in loader:\n        step(model, x, criterion, optimizer)\n",
                    "criterion = PairLoss().cuda()\ntrain(model, loader, criterion=criterion, optimizer=optimizer)\n")
    found = [t for t in todos if "is handed to `train` in trainer.py" in t]
    assert len(found) == 1 and "losses.py:7 `a @ b.T`" in found[0] and "all_gather" in found[0], todos


def test_a_per_sample_loss_handed_to_the_projects_training_function_is_no_todo(tmp_path):
    trainer = "def train(model, loader, criterion, optimizer):\n    for (x,) in loader:\n" \
              "        criterion(model(x), x).backward()\n"
    todos = _handed(tmp_path, "(a * b).sum(-1).mean()", trainer,
                    "train(model, loader, PairLoss(), optimizer)\ncriterion = PairLoss()\n"
                    "train(model, loader, criterion, optimizer)\n")
    assert not [t for t in todos if "compares the samples" in t], todos
    # a contrastive loss handed to code that never calls backward() (an evaluation): nothing trains with it there
    todos = _handed(tmp_path, "-(a @ b.T).diag().mean()", trainer.replace(".backward()", ".item()"),
                    "criterion = PairLoss()\ntrain(model, loader, criterion, optimizer)\n")
    assert not [t for t in todos if "compares the samples" in t], todos

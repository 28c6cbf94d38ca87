"""`ddpkit port`: where each value lives after the port. CPU tensors meeting the ctx.device values (batches of
ddpkit's loaders, the model's outputs) are moved or named, and the moves of batches a kept torch DataLoader delivers
on the CPU stay.

A CPU run never sees a device mismatch: every value is on the CPU. The runs here put the ported script on the
`meta` device instead (a stand-in ddpkit whose context, loaders and wrap use it): a CPU tensor meeting a meta tensor
raises as a CPU tensor meeting a CUDA one does, and a zero-dimensional CPU tensor mixes with both.
"""

from __future__ import annotations

import ast
import contextlib
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from ddpkit.device import to_device
from ddpkit.port import port_source
from ddpkit.port.project import project_loaders

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / name
    return port_source(path.read_text(), str(path))


def _line_after_todo(result, text: str) -> str:
    lines = result.code.splitlines()
    [i] = [i for i, line in enumerate(lines) if line.strip() == text]
    return lines[i - 1]


class _MetaContext:
    device, rank, world_size, seed, is_main = torch.device("meta"), 0, 1, 0, True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self) -> None:
        pass


class _CpuContext(_MetaContext):
    device = torch.device("cpu")


def _meta_ddpkit() -> types.ModuleType:
    """A stand-in ddpkit for one process whose device is `meta` (the CPU under `init(device="cpu")`): the loaders
    deliver each batch there, wrap moves the model there."""
    fake = types.ModuleType("ddpkit")

    def loader(dataset, ctx, batch_size, shuffle=False, **options):
        for batch in DataLoader(dataset, batch_size=max(batch_size, 1), shuffle=shuffle):
            yield [t.to(ctx.device) for t in batch]

    fake.init = lambda *a, device="auto", **k: _MetaContext() if device != "cpu" else _CpuContext()
    fake.loader = fake.eval_loader = loader
    fake.wrap = lambda model, ctx, **k: model.to(ctx.device)
    fake.device = types.ModuleType("ddpkit.device")
    fake.device.to_device = to_device
    fake.unwrap = lambda model: model
    fake.print0 = lambda ctx, *a, **k: None
    fake.barrier = lambda ctx: None
    fake.all_reduce_sum = lambda ctx, value: torch.as_tensor(value, dtype=torch.float64)
    fake.collectives = types.ModuleType("ddpkit.collectives")
    fake.collectives.all_reduce_number = lambda ctx, value: value
    fake.rng = types.SimpleNamespace(seed_everything=lambda seed: None, rank_seed=lambda seed, rank: seed,
                                     rng_state=lambda: None, set_rng_state=lambda state: None)
    return fake


def _run_on_meta(code: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _meta_ddpkit()
    fake.__path__ = []  # a package: the port imports ddpkit.rng where the script seeds itself before ddpkit.init
    monkeypatch.setitem(sys.modules, "ddpkit", fake)
    monkeypatch.setitem(sys.modules, "ddpkit.rng", fake.rng)
    monkeypatch.setitem(sys.modules, "ddpkit.device", fake.device)
    monkeypatch.setitem(sys.modules, "ddpkit.collectives", fake.collectives)
    monkeypatch.setattr(sys, "argv", ["ported.py", *argv])
    with contextlib.redirect_stdout(None):
        exec(compile(code, "ported.py", "exec"), {"__name__": "__main__"})


def test_noise_drawn_on_the_cpu_and_added_to_a_device_batch_is_made_on_the_device_where_it_is_drawn():
    result = _port("noise_before_move.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # both branches that reach `signal + eps` draw on ctx.device; the probe's noise meets CPU data and stays
    assert "eps = (torch.randn(signal.shape) * args.sigma).to(ctx.device)" in lines
    assert "eps = torch.empty(signal.size()).uniform_(-args.sigma, args.sigma).to(ctx.device)" in lines
    assert "eps = torch.randn(probe.shape) * args.sigma" in lines
    assert not any("meets" in t.message for t in result.todos), [t.message for t in result.todos]
    ast.parse(result.code)


@pytest.mark.parametrize("kind", ["gauss", "uniform"])
def test_the_ported_denoiser_runs_with_its_batches_on_another_device(kind, monkeypatch):
    _run_on_meta(_port("noise_before_move.py").code, ["--kind", kind], monkeypatch)


def test_batch_moves_stay_where_a_kept_torch_dataloader_may_deliver_the_batches():
    result = _port("kept_loader_moves.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # one path keeps a DataLoader (a weighted sampler): its CPU batches still need the script's moves
    assert "feats = feats.to(ctx.device)" in lines and "target = target.to(ctx.device)" in lines
    assert "train_batches = ddpkit.loader(dataset, ctx, batch_size=16 // ctx.world_size, shuffle=True)" in lines
    assert result.exit_code == 3  # the sampler's TODO


@pytest.mark.parametrize("data", ["balanced", "weighted"])
def test_the_ported_classifier_runs_on_another_device_from_either_loader(data, monkeypatch):
    _run_on_meta(_port("kept_loader_moves.py").code, ["--data", data], monkeypatch)


def test_batch_moves_of_ddpkit_loaders_on_every_path_are_still_dropped():
    source = (FIXTURES / "kept_loader_moves.py").read_text().replace(
        "sampler=WeightedRandomSampler(weights, 128)", "shuffle=False")
    result = port_source(source, "kept_loader_moves.py")
    assert "feats.to(ctx.device)" not in result.code and "feats.cuda(" not in result.code
    assert result.exit_code == 0, result.message


def test_a_cpu_tensor_from_a_helper_meeting_the_models_output_is_moved_where_it_meets_it():
    result = _port("cpu_test_split.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # `held_y` comes from the script's helper (torch.zeros): moved at the comparison, not where the helper made it
    assert "hits = ((scores > threshold).float() * keep == held_y.to(ctx.device)).float()" in lines
    assert "held_x, held_y = make_split(32)" in lines
    assert "keep = torch.ones(32, device=ctx.device)" in lines  # made in the scope: made on the device
    assert "threshold = torch.tensor(0.0)" in lines  # zero-dimensional: mixes with any device
    assert not any("meets" in t.message for t in result.todos), [t.message for t in result.todos]


def test_a_cpu_tensor_given_to_a_method_of_the_model_is_moved_there():
    result = _port("ema_inside.py")
    assert "mse = nn.functional.mse_loss(ddpkit.unwrap(model).avg(x.to(ctx.device)), y.to(ctx.device)).item()" \
        in result.code
    assert result.exit_code == 0, result.todos


def test_values_that_meet_only_cpu_values_are_left_alone():
    source = (FIXTURES / "cpu_test_split.py").read_text().replace(
        "hits = ((scores > threshold).float() * keep == held_y).float()",
        "hits = (held_x[:, 0] * keep == held_y).float()")
    result = port_source(source, "cpu_test_split.py")
    assert not any("meets" in t.message for t in result.todos), [t.message for t in result.todos]
    assert "keep = torch.ones(32)" in [line.strip() for line in result.code.splitlines()]


def test_a_torch_creator_called_where_it_meets_the_models_output_gets_the_device():
    source = '''
import torch
from torch import nn
from torch.autograd import Variable
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=16, shuffle=True)
net = nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for (x,) in loader:
    loss = nn.functional.mse_loss(net(x), torch.ones(len(x), 1))
    loss = loss + (net(x) - torch.FloatTensor(len(x), 1).fill_(0.5)).abs().mean()
    loss = loss + nn.functional.l1_loss(net(x), Variable(torch.zeros([len(x), 1])))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''
    result = port_source(source, "inline.py")
    assert "loss = nn.functional.mse_loss(net(x), torch.ones(len(x), 1, device=ctx.device))" in result.code
    assert "nn.functional.l1_loss(net(x), Variable(torch.zeros([len(x), 1], device=ctx.device)))" in result.code
    # a legacy constructor takes no device=: named, not guessed
    [todo] = [t for t in result.todos if "meets" in t.message]
    assert todo.line == 12 and todo.message.startswith("`torch.FloatTensor(len(x), 1).fill_(0.5)` (on the CPU) meets")


def test_a_tensor_drawn_with_a_cpu_generator_is_moved_not_drawn_on_the_device():
    source = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

gen = torch.Generator().manual_seed(3)
loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=16, shuffle=True)
net = nn.Linear(4, 4)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for (x,) in loader:
    jitter = torch.randn(x.shape, generator=gen)
    loss = (net(x + jitter) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''
    result = port_source(source, "jitter.py")
    assert "jitter = torch.randn(x.shape, generator=gen).to(ctx.device)" in result.code
    assert result.exit_code == 0, result.todos


def test_a_helper_that_builds_the_wrapped_model_and_another_keeps_its_move_for_the_other():
    result = _port("helper_built_models.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # `model` inside build() is the helper's own module: the teacher it also builds is never wrapped
    assert "model = model.to(ctx.device)" in lines
    assert "model = ddpkit.wrap(build(), ctx)" in lines and "teacher = build(teacher=True)" in lines


def test_the_ported_helper_built_teacher_meets_the_wrapped_model_on_another_device(monkeypatch):
    _run_on_meta(_port("helper_built_models.py").code, [], monkeypatch)


def test_a_model_left_unwrapped_in_a_script_that_names_no_device_keeps_every_rank_on_the_cpu(monkeypatch):
    result = _port("self_training_cpu.py")
    assert result.exit_code == 3 and any("optimizer is built inside the model" in t.message for t in result.todos)
    assert 'with ddpkit.init(device="cpu") as ctx:' in [line.strip() for line in result.code.splitlines()]
    # a CPU-only port is a TODO, never a note on the summary line
    assert any(t.message.startswith('ddpkit.init(device="cpu") keeps every rank on the CPU') for t in result.todos)
    # the model stays on the CPU with the hidden state its forward makes: the loader's batches must come there
    _run_on_meta(result.code, [], monkeypatch)


def test_a_wrapped_model_or_a_named_device_keeps_the_default_device():
    source = (FIXTURES / "self_training_cpu.py").read_text()
    named = port_source(source.replace("tagger = Tagger()", "tagger = Tagger().to('cuda')"), "named.py")
    assert "ddpkit.init() as ctx" in named.code


def test_inputs_a_library_call_runs_the_model_on_are_made_on_its_device():
    from ddpkit.port import port_source

    source = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def main():\n"
        "    device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)\n"
        "    net = torch.nn.Linear(4, 1).to(device)\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    for xb, yb in loader:\n"
        "        loss = torch.nn.functional.mse_loss(net(xb.to(device)), yb.to(device))\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
        "    example = torch.randn(1, 4)\n"
        "    torch.onnx.export(net, example, 'net.onnx')\n"
        "    probe = torch.zeros(2, 4)\n"
        "    traced = torch.jit.trace(net, probe)\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    code = port_source(source, "export.py").code
    assert "example = torch.randn(1, 4, device=ctx.device)" in code
    assert "probe = torch.zeros(2, 4, device=ctx.device)" in code
    # a function of the script handed the model decides where its inputs go: nothing is moved for it
    own = source.replace("    traced = torch.jit.trace(net, probe)\n", "    traced = trace_it(net, probe)\n").replace(
        "\n\ndef main():", "\n\ndef trace_it(model, x):\n    return torch.jit.trace(model, x)\n\n\ndef main():")
    assert "probe = torch.zeros(2, 4)\n" in port_source(own, "export.py").code


def test_a_tensor_made_from_a_list_the_script_filled_meets_the_model_output_on_its_device():
    result = port_source(textwrap.dedent('''\
        import torch
        import torch.nn as nn

        model = nn.Linear(4, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for step in range(10):
            targets = []
            for i in range(8):
                targets.append(float(i))
            values = model(torch.randn(8, 4)).squeeze(1)
            loss = ((torch.tensor(targets, dtype=torch.float32) - values) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    '''), "returns.py")
    # a list becomes a 1-d tensor on the CPU: minus the wrapped model's output (on the GPU) it would fail there
    assert "torch.tensor(targets, dtype=torch.float32, device=ctx.device) - values" in result.code


def test_labels_the_script_collected_on_the_cpu_beside_cpu_predictions_stay_on_the_cpu():
    result = port_source(textwrap.dedent('''\
        import numpy as np
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = nn.Linear(4, 2).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=8, shuffle=True)
        for epoch in range(2):
            targets, predictions = [], []
            for x, y in loader:
                out = model(x.to(device))
                loss = nn.functional.cross_entropy(out, y.to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                targets.append(y)
                predictions.append(out.detach().cpu())
                counts = np.bincount(y, minlength=2)
            correct = (torch.cat(predictions).argmax(1) == torch.cat(targets)).sum()
    '''), "collect.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # the loader now delivers y on ctx.device; the script kept it on the CPU here, beside CPU predictions
    assert "targets.append(y.cpu())" in lines and "counts = np.bincount(y.cpu(), minlength=2)" in lines
    assert "loss = nn.functional.cross_entropy(out, y)" in lines  # where it met the model: as it arrives


def test_labels_an_evaluation_function_collects_beside_cpu_predictions_stay_on_the_cpu_for_sklearn():
    # the evaluation loop never moves its labels (the original kept them on the CPU); its predictions it brings to
    # the CPU itself, and both go to a host library later: after the port the eval loader delivers them on
    # ctx.device, so they are brought back where they are collected
    result = port_source(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = nn.Linear(4, 2).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        val_loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)), torch.arange(64)),
                                batch_size=8, shuffle=False)


        def evaluate():
            labels, preds, names = [], [], []
            for x, label, ids in val_loader:
                out = model(x.to(device))
                preds.append(out.argmax(1).cpu())
                labels.append(label)
                names.append(ids)
                loss = nn.functional.cross_entropy(out.cpu(), label.cpu())
            return torch.cat(preds), torch.cat(labels)


        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        pred, label = evaluate()
        accuracy = (pred.numpy() == label.numpy()).mean()
    '''), "collect_eval.py")
    lines = [line.strip() for line in result.code.splitlines()]
    assert "labels.append(label.cpu())" in lines, result.code
    assert "names.append(ids)" in lines  # not read as a tensor in this scope: it is left as it is


def test_a_legacy_cpu_constructor_over_a_batch_drawn_from_the_loader_keeps_the_batch_on_its_device(monkeypatch):
    result = port_source(textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, shuffle=True)
        for epoch in range(1):
            batches = iter(loader)
            for step in range(4):
                data = next(batches)
                real = torch.FloatTensor(data[0])
                real = real.to(device)
                loss = model(real).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    '''), "legacy.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # torch.FloatTensor(t) of a GPU tensor raises TypeError; the loader now delivers data on ctx.device
    assert "real = torch.as_tensor(data[0], dtype=torch.float32)" in lines, result.code
    _run_on_meta(result.code, [], monkeypatch)


# ---- batches of a torch DataLoader the project returns, in a script that names no device -----------------------
def _moved_lines(result) -> list[str]:
    return [line.strip() for line in result.code.splitlines() if "this loader gives CPU batches" in line]


def test_batches_of_the_projects_loaders_are_moved_at_the_top_of_the_training_and_evaluation_loops():
    result = _port("cpu_project_loaders/train.py")
    lines = [line.strip() for line in result.code.splitlines()]
    # `y` is used as a tensor (`y.long()`, `y.numpy()`): .to(); `x` only reaches the model: to_device, whatever it is
    for loop in ("for x, y in train_loader:", "for step, (x, y) in enumerate(loader):"):
        at = lines.index(loop)
        assert lines[at + 1].startswith("x = ddpkit.device.to_device(x, ctx.device)  #") and lines[at + 2] == \
            "y = y.to(ctx.device)", lines[at:at + 3]
    assert "labels.extend(y.cpu().numpy().tolist())" in lines  # read back on the host
    assert "def evaluate(model, loader, *, ctx):" in lines and "import ddpkit.device" in lines
    # what is left is the sharding: the loader the project returns is no ddpkit loader
    assert result.exit_code == 3 and [t.message.split(":")[0] for t in result.todos] == [
        "no training DataLoader found"], [t.message for t in result.todos]
    ast.parse(result.code)


def test_a_dict_batch_is_moved_whole_and_a_loop_that_hands_it_to_numpy_keeps_its_todo():
    result = _port("cpu_dict_loaders/train.py")
    lines = [line.strip() for line in result.code.splitlines()]
    at = len(lines) - 1 - lines[::-1].index("for batch in loader:")  # training's loop, after test()'s
    assert lines[at + 1].startswith("batch = ddpkit.device.to_device(batch, ctx.device)  #")
    assert len(_moved_lines(result)) == 1  # test() joins `batch["y"]` with numpy: moving it would break that
    todo = _line_after_todo(result, 'guesses.append(model(batch["x"]).argmax(1).cpu().numpy())')
    assert "`batch[\"x\"]` comes from a batch of `loader`" in todo, todo
    assert result.exit_code == 3


def test_evaluation_batches_of_the_projects_loader_reach_the_model_on_its_device(monkeypatch):
    folder = FIXTURES / "cpu_eval_project_loader"
    result = _port("cpu_eval_project_loader/train.py")
    assert result.exit_code == 0, result.message  # the training loader is ddpkit's; the evaluation batches moved
    lines = [line.strip() for line in result.code.splitlines()]
    at = lines.index("for x, y in loader:")
    assert lines[at + 1].startswith("x = ddpkit.device.to_device(x, ctx.device)") and lines[at + 2] == \
        "y = ddpkit.device.to_device(y, ctx.device)", lines[at:at + 3]
    monkeypatch.syspath_prepend(str(folder))
    _run_on_meta(result.code, [], monkeypatch)  # the CPU batches would meet the meta weights and raise


def test_only_a_torch_dataloader_returned_by_every_path_of_a_project_function_counts(tmp_path):
    (tmp_path / "feeds.py").write_text(textwrap.dedent('''\
        import torch
        from torch.utils.data import DataLoader
        from torch_geometric.loader import DataLoader as GraphLoader

        def plain(ds):
            return DataLoader(ds, batch_size=4)

        def bound(ds):
            out = torch.utils.data.DataLoader(ds)
            return out

        def graphs(ds):
            return GraphLoader(ds)

        def either(ds, fast):
            if fast:
                return DataLoader(ds)
            return iter(ds)
        '''))
    tree = ast.parse("from feeds import plain, bound, graphs, either\n"
                     "plain(d)\nbound(d)\ngraphs(d)\neither(d, True)\n")
    files = {str(tmp_path / "feeds.py"): (tmp_path / "feeds.py").read_text()}
    assert set(project_loaders(tree, str(tmp_path), files)) == {"plain", "bound"}


_REPLAY_STEP = """\
import copy

import numpy as np
import torch
import torch.nn as nn


def main():
    net = nn.Linear(4, 2)
    target_net = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    states = np.ones((64, 4), dtype=np.float32)
    actions = np.zeros(64, dtype=np.int64)
    rewards = np.ones(64, dtype=np.float32)
    dones = np.zeros(64, dtype=np.float32)
    for step in range(3):
        idx = np.random.randint(0, 64, size=8)
        s, a, r, s2, d = states[idx], actions[idx], rewards[idx], states[idx], dones[idx]
        s_t = torch.from_numpy(s)
        a_t = torch.from_numpy(a)
        r_t = torch.from_numpy(r)
        s2_t = torch.from_numpy(s2)
        d_t = torch.from_numpy(d)
        q = net(s_t).gather(1, a_t.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            best = target_net(s2_t).max(dim=1).values
            target = r_t + 0.99 * (1.0 - d_t) * best
        loss = nn.functional.smooth_l1_loss(q, target)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


def test_tensors_of_one_replay_batch_that_meet_a_max_over_the_target_networks_output_move_with_it(monkeypatch):
    # `.max(dim=1).values` of the target network's output is on ctx.device: the rewards and done flags made from
    # the same replay batch meet it there, so they move with the states (a device mismatch on a GPU rank before)
    result = port_source(_REPLAY_STEP, "replay.py")
    lines = [line.strip() for line in result.code.splitlines()]
    assert "r_t = torch.from_numpy(r).to(ctx.device)" in lines
    assert "d_t = torch.from_numpy(d).to(ctx.device)" in lines
    _run_on_meta(result.code, [], monkeypatch)

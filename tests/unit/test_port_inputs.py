"""`ddpkit port` on data without a training DataLoader, tensors made on the CPU, datasets on the device."""

from __future__ import annotations

from pathlib import Path

from ddpkit.port import port_source
from ddpkit.port.feeds import NOT_SHARDED

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def _messages(result) -> list[str]:
    return [t.message for t in result.todos]


def _others(result) -> list[str]:
    """The TODOs besides the one that says every rank trains on all of the data (no speed-up)."""
    return [m for m in _messages(result) if not m.startswith(NOT_SHARDED)]


def test_full_batch_training_is_ported_with_its_tensors_on_ctx_device_and_a_todo_that_it_is_not_sharded():
    result = _port("fullbatch")
    assert _messages(result) == [m for m in _messages(result) if m.startswith(NOT_SHARDED)] != [], _messages(result)
    for name, rows in (("x_train", "features[:300]"), ("y_train", "labels[:300]"), ("x_test", "features[300:]"),
                       ("y_test", "labels[300:]")):  # y_* meet the model's output: on the same device
        assert f"{name} = torch.from_numpy({rows}).to(ctx.device)\n" in result.code
    assert 'ddpkit.print0(ctx, "first predictions", predicted[:4, 0].cpu().numpy())' in result.code
    assert "no speed-up" in result.todos[0].message and "ported fully" not in result.message


def test_random_batches_drawn_per_step_are_drawn_per_rank_after_the_scripts_seed():
    result = _port("random_batches")
    code = result.code
    assert result.todos == [], _messages(result)
    reseed = "ddpkit.rng.seed_everything(ddpkit.rng.rank_seed(ctx.seed, ctx.rank))"
    # the script's seed keeps the split and the model init alike; the draws differ from the training loop on
    assert code.index("torch.manual_seed(0)") < code.index("model = ddpkit.wrap(") < code.index(reseed) \
        < code.index("for step in range(args.steps):")
    # each rank draws its share of the batch: the global batch of args.batch_size is kept
    assert "offsets = torch.randint(len(tokens) - block - 1, (args.batch_size // ctx.world_size,))" in code
    assert "# ddpkit port: each rank draws args.batch_size // world_size samples here" in code
    assert "the global batch of args.batch_size is kept" in result.message


def test_a_dataset_that_puts_samples_on_the_device_gets_unpinned_loaders_unless_workers_fork():
    result = _port("device_dataset")
    assert result.todos == [], _messages(result)
    assert "shuffle=True, pin_memory=False)" in result.code
    assert "ddpkit.eval_loader(test_set, ctx, batch_size=64, pin_memory=False)" in result.code
    path = FIXTURES / "device_dataset.py"
    workers = port_source(path.read_text().replace("shuffle=True)", "shuffle=True, num_workers=2)"), str(path))
    assert [t.line for t in workers.todos][:1] == [42] and workers.todos[0].message.startswith(
        "the dataset is given the device")  # CUDA in forked worker processes


_STEP = ("    loss = model(x).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")


def _script(loop: str) -> str:
    return ("import torch\nfrom torch import nn\n\nx = torch.ones(4, 2, device='cpu')\nmodel = nn.Linear(2, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + loop)


def test_a_step_count_that_ranks_may_decide_differently_keeps_the_no_loader_todo():
    shapes = {
        "an environment loop": "done = False\nwhile not done:\n" + _STEP + "    done = env.step()\n",
        "a replay buffer": "for episode in range(100):\n    if len(memory) > 2000:\n" + _STEP.replace(
            "    ", "        "),
        "an iterator": "for batch in train_iter:\n" + _STEP,
        "a growing buffer": "memory = []\nfor episode in range(100):\n    memory.append(episode)\n"
                            "    for i in range(len(memory) // 8):\n" + _STEP.replace("    ", "        "),
    }
    for what, loop in shapes.items():
        result = port_source(_script(loop))
        assert any(m.startswith("no training DataLoader found") for m in _messages(result)), what
    fixed = port_source(_script("for epoch in range(100):\n    if epoch % 10 == 0:\n" + _STEP.replace(
        "    ", "        ")))
    assert _others(fixed) == [] and len(_messages(fixed)) == 1


def test_unseeded_data_drawn_before_training_is_alike_and_cpu_batches_of_a_script_without_a_device_are_todos():
    unseeded = port_source("import torch\nfrom torch import nn\n\nx = torch.randn(64, 2)\nmodel = nn.Linear(2, 1)\n"
                           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(10):\n" + _STEP)
    # every rank draws alike from ddpkit.init until training: the same data on every rank
    assert _others(unseeded) == [], _messages(unseeded)
    assert unseeded.code.index("ddpkit.rng.seed_everything(ctx.seed)") < unseeded.code.index("x = torch.randn(64, 2")
    # a model's own random init is not data: ddpkit.wrap broadcasts rank 0's parameters
    model_init = port_source("import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
                             "    def __init__(self):\n        super().__init__()\n"
                             "        self.w = nn.Parameter(torch.randn(2, 1))\n\n    def forward(self, x):\n"
                             "        return x @ self.w\n\n\nx = torch.ones(4, 2, device='cpu')\nmodel = Net()\n"
                             "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(10):\n" + _STEP)
    assert _others(model_init) == [], _messages(model_init)
    cpu = port_source("import torch\nfrom torch import nn\n\ndata = torch.arange(100.)\n\n\ndef get_batch():\n"
                      "    i = torch.randint(90, (8,))\n    return data[i, None], data[i, None]\n\n\n"
                      "model = nn.Linear(1, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for step in range(10):\n    x, y = get_batch()\n" + _STEP)
    assert any("`x` is made on the CPU (the script names no device)" in m for m in _messages(cpu)), _messages(cpu)


def test_pyplot_calls_run_on_rank_0():
    result = port_source("import matplotlib.pyplot as plt\nimport torch\nfrom torch import nn\n\n"
                         "x = torch.ones(4, 2, device='cpu')\nmodel = nn.Linear(2, 1)\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nplt.ion()\nfor epoch in range(3):\n"
                         + _STEP + "    plt.plot([epoch], [loss.item()]); plt.pause(0.1)\nplt.show()\n")
    assert "if ctx.is_main:\n    plt.ion()\n" in result.code and "if ctx.is_main:\n    plt.show()\n" in result.code
    assert "    if ctx.is_main:\n        plt.plot([epoch], [loss.item()]); plt.pause(0.1)\n" in result.code


def test_noise_drawn_in_each_step_is_drawn_on_ctx_device_and_per_rank():
    result = port_source("import torch\nfrom torch import nn\n\nmodel = nn.Linear(4, 1)\n"
                         "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(10):\n"
                         "    z = torch.randn(8, 4)\n    loss = model(z).pow(2).mean()\n    opt.zero_grad()\n"
                         "    loss.backward()\n    opt.step()\n")
    # a literal size may be a shape as well as a batch: the port does not divide it, and says so
    (todo,) = result.todos
    assert todo.line == 7 and "`torch.randn(8, 4)` draws a batch" in todo.message and "literal `8`" in todo.message
    assert "    z = torch.randn(8, 4, device=ctx.device)\n" in result.code
    # every rank drew alike since ddpkit.init: each draws its own noise from the loop on
    assert result.code.index("ddpkit.rng.seed_everything(ddpkit.rng.rank_seed(ctx.seed, ctx.rank))") < \
        result.code.index("for step in range(10)")


def test_a_training_function_of_a_top_level_script_is_followed_to_the_loop_that_calls_it():
    head = ("import torch\nfrom torch import nn\n\nx = torch.ones(4, 2, device='cpu')\nmodel = nn.Linear(2, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n\ndef train(epoch):\n" + _STEP + "\n\n")
    fixed = port_source(head + "for epoch in range(5):\n    train(epoch)\n")
    assert _others(fixed) == [] and len(_messages(fixed)) == 1, _messages(fixed)
    decided = port_source(head + "epoch = 0\nwhile not done():\n    train(epoch)\n")
    assert any(m.startswith("no training DataLoader found") for m in _messages(decided))


def test_loader_internals_read_the_dataset_size_or_are_named():
    result = _port("loader_internals")
    code = result.code
    # DataLoader's default samplers hold every sample: the reduced sums are divided by the global count
    assert "train_loss = train_loss / len(train_loader.dataset)\n" in code
    assert "valid_loss = valid_loss / len(valid_loader.dataset)\n" in code
    assert ".sampler" not in code.split("ddpkit.init", 1)[1]
    # ddpkit.eval_loader answers batch_size as a DataLoader does (the batch it yields): nothing to name
    assert result.todos == [] and "({valid_loader.batch_size} per batch)" in code, result.todos


def test_a_step_in_a_closure_over_a_generator_names_the_iterable_where_it_is_made_and_its_cpu_input():
    result = _port("closure_batches")
    lines = {t.line: t.message for t in result.todos}
    assert "ported fully" not in result.message
    # the TODO sits at the loop and names the iterable back to the call that makes it
    assert lines[18].startswith("no training DataLoader found: the training loop at line 18 iterates `batches` "
                                "(`batches` is a parameter of `run_epoch`, given `train_batches` made at line 35 by "
                                "`token_batches(tokens, budget=64)`)")
    assert lines[20].startswith("`batch.float()` is made on the CPU")  # and the model is on ctx.device


def test_a_path_built_from_a_per_rank_value_that_rank_0_writes_and_every_rank_reads_is_named():
    result = _port("per_rank_path")
    assert "ported fully" not in result.message
    # time.time() differs per rank whatever the seed: the name flows through best_path into the save and the load
    assert [(t.line, t.message.split(",")[0]) for t in result.todos] == [
        (10, "`run_name` is built from `time.time()`")]
    assert "line 24 read on every rank" in result.todos[0].message


def test_a_cpu_target_that_meets_the_models_output_in_a_helper_step_is_named_with_the_input():
    source = '''import torch
from torch import nn


def step(model, crit, opt, x_part, y_part):
    out = model.forward(x_part)
    loss = crit(out, y_part)
    opt.zero_grad()
    loss.backward()
    opt.step()


def main():
    xs = torch.from_numpy(__import__("numpy").ones((40, 3), dtype="float32"))
    ys = torch.zeros(40, 1)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    crit = nn.MSELoss()
    n = len(xs) // 8
    for epoch in range(2):
        for k in range(n):
            step(model, crit, opt, xs[k * 8:(k + 1) * 8], ys[k * 8:(k + 1) * 8])


if __name__ == "__main__":
    main()
'''
    result = port_source(source, "sliced.py")
    assert "ported fully" not in result.message
    moved = [t for t in result.todos if "is made on the CPU" in t.message]
    # `model.forward(x)` is a forward of the wrapped model, and `y_part` meets its output in the loss
    assert [(t.line, t.message.split(":")[0]) for t in moved] == [(6, (
        "`x_part` is made on the CPU (the script names no device) and given to the model, which ddpkit.wrap put on "
        "ctx.device; so is `y_part`, which meets the model's output (the loss's target)"))]
    # the loop whose count the port cannot follow is the TODO's place, and its header is named
    loops = [t for t in result.todos if t.message.startswith("no training DataLoader found")]
    assert [(t.line, t.message.split(" counts")[0]) for t in loops] == [
        (21, "no training DataLoader found: the training loop at line 21 (`for k in range(n)`)")]


def test_a_function_of_the_script_that_builds_the_loader_from_the_device_is_no_dataset_given_the_device():
    source = ("import torch\nfrom torch.utils.data import DataLoader, Dataset\n\n\nclass Pairs(Dataset):\n"
              "    def __len__(self):\n        return 8\n\n    def __getitem__(self, i):\n"
              "        return torch.zeros(4), torch.zeros(4)\n\n\nclass Prefetcher:\n"
              "    def __init__(self, loader, device):\n        self.loader, self.device = loader, device\n\n"
              "    def __iter__(self):\n        return ((x.to(self.device), y.to(self.device)) for x, y in self.loader)\n\n\n"
              "def load_datasets(device):\n    loader = DataLoader(Pairs(), batch_size=4, shuffle=True, num_workers=2)\n"
              "    return Prefetcher(loader, device)\n\n\ndef main():\n    device = torch.device('cuda')\n"
              "    batches = load_datasets(device)\n    model = torch.nn.Linear(4, 4).to(device)\n"
              "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x, y in batches:\n"
              "        opt.zero_grad()\n        model(x).sum().backward()\n        opt.step()\n\n\n"
              "if __name__ == '__main__':\n    main()\n")
    result = port_source(source, "prefetch.py")
    # the function hands the device to a prefetcher over the loader, not to a dataset
    assert not [t for t in result.todos if "the dataset is given the device" in t.message], _messages(result)


def test_loader_attributes_ddpkits_loaders_lack_are_named_and_those_they_answer_are_not():
    source = ("import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
              "loader = DataLoader(TensorDataset(torch.randn(64, 2), torch.randn(64, 1)), batch_size=16, "
              "shuffle=True)\nmodel = nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "seen = 0\nfor x, y in loader:\n    loss = nn.functional.mse_loss(model(x), y)\n    opt.zero_grad()\n"
              "    loss.backward()\n    opt.step()\n    seen += loader.batch_size + loader.num_workers\n")
    assert port_source(source).todos == []
    lacked = port_source(source.replace("loader.num_workers", "len(loader.batch_sampler)"))
    assert [t.message.split(":")[0] for t in lacked.todos] == [
        "`loader.batch_sampler` reads an attribute of torch's DataLoader, but `loader` is now ddpkit.loader, which "
        "has no such attribute"], lacked.todos

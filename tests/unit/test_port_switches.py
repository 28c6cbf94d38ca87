"""`ddpkit port` follows the script's own switches: its GPU flag, its argument parsing, its batch size, its seed."""

from __future__ import annotations

from pathlib import Path

from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def test_a_gpu_switch_that_moves_only_the_inputs_decides_ddpkits_device():
    code = _port("gpu_switch_inputs").code
    # without --no-cuda the batches go to the GPU; with it they stay on the CPU: the model must follow
    assert 'with ddpkit.init(device="auto" if (not args.no_cuda and torch.cuda.is_available()) else "cpu") as ctx:' \
        in code


def test_parsing_after_global_declarations_and_quiet_lines_stays_before_init():
    result = _port("parse_after_global")
    lines = result.code.splitlines()
    parse = lines.index("    opt = parser.parse_args()")
    init = next(i for i, line in enumerate(lines) if "ddpkit.init(" in line)
    assert parse < init, "argument parsing must run before ddpkit.init (--help needs no process group)"
    # the switch that moves model and inputs is read where ddpkit.init can see it
    assert lines[init] == '    with ddpkit.init(device="auto" if opt.cuda else "cpu") as ctx:'
    assert not result.todos


def test_a_batch_of_one_through_a_name_bound_from_an_option_with_its_own_dest_is_a_todo():
    result = _port("batch_from_args")
    assert [t.message for t in result.todos if t.message.startswith("the batch size is 1")], result.todos
    assert result.exit_code == 3 and "ported fully" not in result.message


def test_a_batch_of_one_in_a_config_dict_and_a_string_default_are_todos():
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\nconfig = {'lr': 0.1, 'batch_size': 1}\n"
           "loader = DataLoader(ds, batch_size=config['batch_size'], shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=config['lr'])\n")
    assert any(t.message.startswith("the batch size is 1") for t in port_source(src).todos)
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\np = argparse.ArgumentParser()\n"
           "p.add_argument('--bs', type=int, default='1')\nargs = p.parse_args()\n"
           "loader = DataLoader(ds, batch_size=args.bs, shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    assert any(t.message.startswith("the batch size is 1") for t in port_source(src).todos)


def test_a_script_seeded_by_its_own_helper_before_init_keeps_its_streams():
    result = _port("own_seed_helper")
    code = result.code
    capture = code.index("rng_before_init = ddpkit.rng.rng_state()")
    init = code.index("ctx = ddpkit.init()")
    restore = code.index("ddpkit.rng.set_rng_state(rng_before_init)")
    dataset = code.index("ShuffledFiles(64), ctx")
    assert capture < init < restore < dataset
    assert "import ddpkit.rng\n" in code
    port_source(code)  # the output parses as a ddpkit script


def test_an_imported_seed_helper_counts_as_seeding_and_unseeded_draws_stay_todos():
    seeded = ("import random\nimport torch\nfrom torch.utils.data import DataLoader\nfrom helpers import setup_seed\n\n"
              "setup_seed(3)\n\n\ndef main():\n    items = list(range(100))\n    random.shuffle(items)\n"
              "    loader = DataLoader(items, batch_size=8, shuffle=True)\n    model = Net()\n"
              "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x in loader:\n"
              "        model(x).sum().backward()\n        opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    code = port_source(seeded).code
    assert "    rng_before_init = ddpkit.rng.rng_state()" in code
    assert "    with ddpkit.init() as ctx:\n        ddpkit.rng.set_rng_state(rng_before_init)" in code
    # a helper whose name says nothing about seeds and that also builds data is not a seed helper
    plain = seeded.replace("from helpers import setup_seed\n", "").replace("setup_seed(3)\n", "")
    assert "rng_before_init" not in port_source(plain).code


def test_a_config_function_that_parses_and_seeds_before_init_keeps_the_scripts_seed():
    src = ("import argparse\nimport numpy as np\nimport torch\n\n\ndef init_config():\n"
           "    parser = argparse.ArgumentParser()\n    parser.add_argument('--taskid', type=int, default=0)\n"
           "    args = parser.parse_args()\n    args.seed = [11, 22, 33][args.taskid]\n"
           "    np.random.seed(args.seed)\n    torch.manual_seed(args.seed)\n    return args\n\n\n"
           "def main(args):\n    model = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    for _ in range(3):\n        model(torch.randn(8, 4)).sum().backward()\n        opt.step()\n\n\n"
           "if __name__ == '__main__':\n    args = init_config()\n    main(args)\n")
    code = port_source(src).code
    # the generators init_config seeded from --taskid are restored after ddpkit.init, not reseeded from ctx.seed
    assert "rng_before_init = ddpkit.rng.rng_state()" in code and "ddpkit.rng.set_rng_state(rng_before_init)" in code
    assert "seed_everything(ctx.seed)" not in code and "rank_seed(ctx.seed" not in code


def test_a_gpu_switch_handed_to_another_module_is_a_todo():
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\nfrom mydata import Frames\n\n"
           "p = argparse.ArgumentParser()\np.add_argument('--use-gpu', action='store_true')\nargs = p.parse_args()\n"
           "ds = Frames('x.npy', args.use_gpu)\nloader = DataLoader(ds, batch_size=8, shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
           "    ((model(x) - y) ** 2).mean().backward()\n    opt.step()\n")
    result = port_source(src)
    assert any("GPU switch `args.use_gpu` is read in another module" in t.message for t in result.todos), result.todos


def test_a_branch_on_another_setting_that_moves_a_built_module_is_not_a_gpu_switch():
    src = ("import argparse\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n\n"
           "p = argparse.ArgumentParser()\np.add_argument('--net', default='a')\nargs = p.parse_args()\n"
           "loader = DataLoader(ds, batch_size=8, shuffle=True)\nif args.net == 'a':\n"
           "    gen = nn.DataParallel(NetA()).cuda()\nelse:\n    gen = nn.DataParallel(NetB()).cuda()\n"
           "opt = torch.optim.SGD(gen.parameters(), lr=0.1)\nfor x, y in loader:\n"
           "    x = x.cuda()\n    ((gen(x) - y) ** 2).mean().backward()\n    opt.step()\n")
    assert "ctx = ddpkit.init()\n" in port_source(src).code


def test_a_device_chosen_by_an_if_else_on_a_switch_keeps_the_cpu_branch_when_the_switch_is_off():
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\n\ndef main():\n"
           "    p = argparse.ArgumentParser()\n    p.add_argument('--use_gpu', action='store_true')\n"
           "    args = p.parse_args()\n    if args.use_gpu:\n"
           "        device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n    else:\n"
           "        device = torch.device('cpu')\n    loader = DataLoader(ds, batch_size=8, shuffle=True)\n"
           "    model = Net().to(device)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    for x, y in loader:\n        ((model(x) - y) ** 2).mean().backward()\n        opt.step()\n\n\n"
           "if __name__ == '__main__':\n    main()\n")
    # without --use_gpu the original trains on the CPU: ctx.device must be the CPU then, not a GPU of the host
    assert 'ddpkit.init(device="auto" if args.use_gpu else "cpu")' in port_source(src).code


def test_a_switch_set_after_init_that_moves_the_model_is_a_todo_naming_it():
    src = ("import sys\nimport torch\nfrom torch.utils.data import DataLoader\n\nck = sys.argv[1]\n"
           "use_gpu = False\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n"
           "use_gpu = use_gpu and torch.cuda.is_available()\nmodel = Net(use_gpu)\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nif use_gpu:\n    model.cuda()\n"
           "for x, y in loader:\n    if use_gpu:\n        x = x.cuda()\n"
           "    ((model(x) - y) ** 2).mean().backward()\n    opt.step()\n")
    result = port_source(src)
    # the original runs on the CPU; ddpkit.init cannot read the switch, so the model would go to a GPU alone
    assert any("`if use_gpu:`" in t.message and 'device="cpu"' in t.message for t in result.todos), result.todos
    assert result.exit_code == 3


def test_a_switch_refined_at_module_level_before_main_is_called_decides_ddpkits_device():
    # `args.cuda = args.cuda and torch.cuda.is_available()` runs before main(): main's ddpkit.init can read it
    code = _port("gpu_switch_module_level").code
    assert '    with ddpkit.init(device="auto" if args.cuda else "cpu") as ctx:' in code

def test_a_batch_size_parameter_is_followed_to_its_callers_and_the_option_default_behind_an_add_argument_alias():
    result = _port("batch_param")
    assert "ported fully" not in result.message
    assert [(t.line, t.message.split(":")[0]) for t in result.todos] == [(10, "the batch size is 1")]
    path = FIXTURES / "batch_param.py"  # a default of 8 through the same path: ported, 8 // world_size per rank
    eight = port_source(path.read_text().replace('"--batch-size", type=int, default=1', '"--batch-size", type=int, '
                                                 'default=8'), str(path))
    assert eight.todos == [] and "batch_size=batch_size // ctx.world_size" in eight.code


def test_a_divided_batch_read_from_a_config_file_is_named_and_one_from_an_option_default_is_not():
    loader = ("loader = DataLoader(ds, batch_size={size}, shuffle=True)\nmodel = Net()\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    head = "import json\nimport torch\nfrom torch.utils.data import DataLoader\nfrom utils import json_file_to_pyobj\n\n"
    for bind, size in [("with open('cfg.json') as f:\n    cfg = json.load(f)\n", "cfg['batch_size']"),
                       ("opts = json_file_to_pyobj('cfg.json')\ntrain_opts = opts.training\n", "train_opts.batchSize")]:
        result = port_source(head + bind + loader.format(size=size))
        named = [t for t in result.todos if "0 on more ranks" in t.message]
        assert len(named) == 1 and f"`{size}`" in named[0].message, result.todos
        assert "at least" in named[0].message and "line " in named[0].message
    options = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\np = argparse.ArgumentParser()\n"
               "p.add_argument('--bs', type=int, default=64)\nargs = p.parse_args()\n")
    assert not [t for t in port_source(options + loader.format(size="args.bs")).todos if "0 on more ranks" in t.message]


def test_a_training_batch_below_a_node_of_8_gpus_is_a_todo_and_8_is_not():
    # `--batch_size` default 4: 4 // 8 is 0 per rank on a node of 8 GPUs, and ddpkit.loader refuses to start
    src = ("import argparse\nimport torch\nfrom torch.utils.data import DataLoader\n\np = argparse.ArgumentParser()\n"
           "p.add_argument('--batch_size', type=int, default={n})\nargs = p.parse_args()\n"
           "loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)\nmodel = Net()\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    small = [t for t in port_source(src.replace("{n}", "4")).todos if t.message.startswith("the batch size is 4")]
    assert len(small) == 1 and "(a node of 8 GPUs)" in small[0].message and small[0].line == 8, small
    assert not [t for t in port_source(src.replace("{n}", "8")).todos if "batch size is" in t.message]


def test_a_squeeze_without_a_dim_in_the_training_loop_needs_two_samples_a_rank():
    # 5 // 3 is 1 sample per rank, and `torch.squeeze(y)` then drops the batch dimension too: at most 2 ranks
    src = ("import torch\nfrom torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size={n}, "
           "shuffle=True)\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
           "    y = {squeeze}\n    loss = model(x, y)\n    loss.backward()\n    opt.step()\n")
    for squeeze in ("torch.squeeze(y)", "y.squeeze()"):
        named = [t for t in port_source(src.format(n=5, squeeze=squeeze)).todos if "batch size is 5" in t.message]
        assert len(named) == 1 and "at most 2 ranks" in named[0].message and "line 8" in named[0].message, named
        assert "max(2, 5 // ctx.world_size)" in named[0].message
        ten = [t for t in port_source(src.format(n=10, squeeze=squeeze)).todos if "batch size is 10" in t.message]
        assert len(ten) == 1 and "at most 5 ranks" in ten[0].message, ten
        assert not [t for t in port_source(src.format(n=16, squeeze=squeeze)).todos if "batch size is" in t.message]
    # a dim named keeps the batch dimension: the bound stays one sample a rank
    kept = [t for t in port_source(src.format(n=5, squeeze="y.squeeze(1)")).todos if "batch size is 5" in t.message]
    assert len(kept) == 1 and "at most 5 ranks" in kept[0].message, kept

"""`ddpkit port` on scripts that train several modules, use nn.DataParallel, or keep the optimizer in the model."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpkit.lint import lint_source
from ddpkit.port import port_source

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures" / "port"


def _port(name: str):
    path = FIXTURES / f"{name}.py"
    return port_source(path.read_text(), str(path))


def _port_text(text: str):
    return port_source(textwrap.dedent(text), "script.py")


def test_a_generator_and_a_discriminator_are_each_wrapped_before_their_optimizer():
    result = _port("gan_pair")
    code = result.code
    assert result.todos == [] and lint_source(code, "gan_pair_ddp.py") == []
    # after apply(init_weights): DDP broadcasts rank 0's parameters when it wraps, so the init must come first
    assert code.index("discriminator.apply(init_weights)") < code.index("generator = ddpkit.wrap(generator, ctx)") \
        < code.index("opt_g = torch.optim.SGD(generator.parameters()")
    assert code.index("discriminator = ddpkit.wrap(discriminator, ctx)") < code.index("opt_d = torch.optim.SGD(")
    assert "generator.to(device)" not in code and "discriminator.to(device)" not in code
    # the training forwards go through the wrappers; the saves read the unwrapped modules
    assert "d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)" in code
    assert '{"g": ddpkit.unwrap(generator).state_dict(), "d": ddpkit.unwrap(discriminator).state_dict()}' in code
    assert not port_source(code, "gan_pair_ddp.py").changed


def test_data_parallel_goes_and_one_optimizer_over_two_modules_wraps_both():
    result = _port("encoder_decoder")
    code = result.code
    assert result.todos == [] and lint_source(code, "encoder_decoder_ddp.py") == []
    assert "DataParallel" not in code.split("def main", 1)[1]
    assert "encoder = ddpkit.wrap(encoder, ctx)" in code  # .module is read between its build and the optimizer
    assert "decoder = ddpkit.wrap(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 12)), ctx)" in code
    assert "decoder = decoder\n" not in code and "decoder = torch.nn" not in code
    assert 'ddpkit.print0(ctx, "code width", ddpkit.unwrap(encoder).width)' in code
    assert '{"enc": ddpkit.unwrap(encoder).state_dict(), "dec": ddpkit.unwrap(decoder).state_dict()}' in code
    assert ".module" not in code


def test_parameters_gathered_in_a_list_or_groups_wrap_every_module():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        encoder = nn.Linear(4, 3)
        decoder = nn.Linear(3, 1)
        head = nn.Linear(3, 1)
        params = list(encoder.parameters()) + list(decoder.parameters())
        opt = torch.optim.Adam(params, lr=1e-3)
        opt_head = torch.optim.SGD([{"params": head.parameters(), "lr": 0.1}])
        for x, y in loader:
            h = encoder(x)
            loss = nn.functional.mse_loss(decoder(h), y) + nn.functional.mse_loss(head(h.detach()), y)
            opt.zero_grad()
            opt_head.zero_grad()
            loss.backward()
            opt.step()
            opt_head.step()
        torch.save(head.state_dict(), "head.pt")
    ''')
    code = result.code
    assert result.todos == [], result.todos
    # the same Parameter objects before and after wrapping: `params` still holds the wrapped modules' parameters
    assert code.index("encoder = ddpkit.wrap(encoder, ctx)\ndecoder = ddpkit.wrap(decoder, ctx)\nopt = ") > 0
    assert "head = ddpkit.wrap(nn.Linear(3, 1), ctx)" in code
    assert "torch.save(ddpkit.unwrap(head).state_dict()" in code
    assert lint_source(code, "script_ddp.py") == []


def _beside_the_cpu_todo(result) -> list:
    """The TODOs other than the CPU-only one, which a port that wraps no model and names no device also gets
    (`ddpkit.init(device="cpu")`: the model the user wraps later stays on the CPU until device= is dropped)."""
    assert sum("keeps every rank on the CPU" in t.message for t in result.todos) == 1
    return [t for t in result.todos if "keeps every rank on the CPU" not in t.message]


def test_a_module_the_codemod_cannot_name_keeps_the_todo():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        heads = [nn.Linear(1, 1)]
        opt = torch.optim.Adam(list(model.parameters()) + list(heads[0].parameters()), lr=1e-3)
        for x, y in loader:
            loss = nn.functional.mse_loss(heads[0](model(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    ''')
    assert result.exit_code == 3
    own = _beside_the_cpu_todo(result)
    assert [t.line for t in own] == [9] and "cannot find the model this optimizer trains" in own[0].message


def test_an_optimizer_inside_the_model_and_models_in_a_list_name_their_blocker():
    inside = _port_text('''
        import torch
        from torch import nn, optim
        from torch.utils.data import DataLoader, TensorDataset


        class Agent(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.optimizer = optim.Adam(self.parameters(), lr=1e-3)

            def train_net(self, x):
                loss = -self.fc(x).log_softmax(-1).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()


        def main():
            model = Agent()
            for (x,) in DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, shuffle=True):
                model.train_net(x)


        if __name__ == "__main__":
            main()
    ''')
    own = _beside_the_cpu_todo(inside)
    assert [t.line for t in own] == [11]
    assert "built inside the model (Agent.__init__" in own[0].message
    listed = '''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        nets = [nn.Linear(4, 1) for _ in range(2)]
        opts = [torch.optim.Adam(net.parameters(), lr=1e-3) for net in nets]
        for x, y in loader:
            for net, opt in zip(nets, opts):
                loss = nn.functional.mse_loss(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        print(nets[0].weight)
    '''
    indexed = _port_text(listed)  # an index into the list would read the DDP wrapper's attributes
    own = _beside_the_cpu_todo(indexed)
    assert [t.line for t in own] == [8] and "each module of `nets`" in own[0].message \
        and "used at line 15" in own[0].message
    assert "\nnets = [ddpkit.wrap(" not in indexed.code


def test_models_kept_in_a_list_are_each_wrapped_and_their_loop_names_are_models():
    result = _port("model_list")
    code = result.code
    assert result.todos == [] and lint_source(code, "model_list_ddp.py") == []
    assert "nets = [Net(width).to(device) for width in (4, 16)]\n        nets = [ddpkit.wrap(m, ctx) for m in nets]\n" \
        "        opts = [torch.optim.SGD(" in code
    assert "loss = loss_fn(net(xb), yb)" in code  # the training forward goes through each wrapper
    assert "correct += (ddpkit.unwrap(net)(xb).argmax(1) == yb).sum().item()" in code
    assert 'f"width {ddpkit.unwrap(net).width}: {correct} of 64"' in code
    assert '{f"net{ddpkit.unwrap(net).width}": ddpkit.unwrap(net).state_dict() for net in nets}' in code
    assert not port_source(code, "model_list_ddp.py").changed


def test_data_parallel_behind_a_device_count_check_and_on_a_frozen_module():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            device = "cuda" if torch.cuda.is_available() else "cpu"
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
            features = nn.DataParallel(nn.Linear(4, 4).to(device))
            features.requires_grad_(False)
            model = nn.Linear(4, 1).to(device)
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model, device_ids=[0, 1])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = nn.functional.mse_loss(model(features(x)), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            torch.save(features.module.state_dict(), "features.pt")
            torch.save(model.module.state_dict(), "model.pt")


        if __name__ == "__main__":
            main()
    ''')
    code = result.code
    assert result.todos == [], result.todos
    assert "DataParallel" not in code and "device_count" not in code
    assert "features = nn.Linear(4, 4).to(device)" in code  # not trained: not wrapped, just on this rank's device
    assert "torch.save(features.state_dict(), \"features.pt\")" in code
    assert "torch.save(ddpkit.unwrap(model).state_dict(), \"model.pt\")" in code
    assert code.index("model = ddpkit.wrap(model, ctx)") < code.index("optimizer = torch.optim.SGD(")
    ast.parse(code)


def test_an_optimizer_chosen_by_a_flag_wraps_the_model_on_every_branch():
    result = _port_text('''
        import argparse
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        parser = argparse.ArgumentParser()
        parser.add_argument("--opt", default="adam")
        parser.add_argument("--net", default="small")
        args = parser.parse_args()
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        if args.net == "small":
            net = nn.Linear(4, 1)
        else:
            net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        if args.opt == "adam":
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        elif args.opt == "sgd":
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''')
    code = result.code
    assert result.todos == [], result.todos
    assert code.count("ddpkit.wrap(") == 2
    assert 'if args.opt == "adam":\n    net = ddpkit.wrap(net, ctx)\n    optimizer = torch.optim.Adam(' in code
    assert 'elif args.opt == "sgd":\n    net = ddpkit.wrap(net, ctx)\n    optimizer = torch.optim.SGD(' in code


def test_autograd_grad_over_parameters_is_a_todo_and_a_gradient_penalty_is_not():
    source = '''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def penalty(critic, x):
            x = x.requires_grad_(True)
            g = torch.autograd.grad(critic(x).sum(), x, create_graph=True)[0]
            return ((g.norm(dim=1) - 1) ** 2).mean()


        loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, shuffle=True)
        critic = nn.Linear(4, 1)
        opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
        for (x,) in loader:
            loss = critic(x).mean() + penalty(critic, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    '''
    assert _port_text(source).todos == []  # the penalty's double backward runs in backward(): averaged by DDP
    grads = _port_text(source.replace("            loss.backward()\n", "            grads = torch.autograd.grad("
                                      "loss, critic.parameters())\n"))
    assert [t.line for t in grads.todos] == [19] and "with respect to the model's parameters" in \
        grads.todos[0].message


def test_the_global_batch_size_used_inside_the_training_loop_is_a_todo():
    source = '''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        batch_size = 16
        loader = DataLoader(TensorDataset(torch.randn(64, 2, 2)), batch_size=batch_size, shuffle=True)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for (x,) in loader:
            x = x.reshape(batch_size, -1)
            loss = nn.functional.mse_loss(model(x), torch.ones(batch_size, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    '''
    result = _port_text(source)
    assert [t.line for t in result.todos] == [11] and "`batch_size` is the global batch" in result.todos[0].message
    # a keyword named batch_size, or an attribute of that name, is not the variable
    ok = _port_text(source.replace("x = x.reshape(batch_size, -1)", "x = x.reshape(len(x), -1)\n"
                                   "            meta = dict(batch_size=len(x), lr=loader.batch_size)").replace(
        "torch.ones(batch_size, 1)", "torch.ones(len(x), 1)"))
    assert "meta = dict(batch_size=len(x), lr=loader.batch_size)" in ok.code
    # not the batch-size variable, and ddpkit.loader answers `batch_size` (the per-rank batch it yields)
    assert ok.todos == [], ok.todos


def test_an_optimizer_made_only_when_fine_tuning_wraps_only_then_and_a_rebinding_is_a_todo():
    source = '''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def train(encoder, decoder, loader, opts):
            for x, y in loader:
                loss = nn.functional.mse_loss(decoder(encoder(x)), y)
                for opt in opts:
                    if opt is not None:
                        opt.zero_grad()
                loss.backward()
                for opt in opts:
                    if opt is not None:
                        opt.step()


        def main(fine_tune=False, checkpoint=None):
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
            if checkpoint is None:
                decoder = nn.Linear(3, 1)
                encoder = nn.Linear(4, 3)
                encoder.requires_grad_(fine_tune)
                dec_opt = torch.optim.Adam(decoder.parameters(), lr=1e-3)
                enc_opt = torch.optim.Adam(encoder.parameters(), lr=1e-3) if fine_tune else None
            else:
                decoder = checkpoint["decoder"]
                encoder = checkpoint["encoder"]
                dec_opt, enc_opt = checkpoint["dec_opt"], None
            train(encoder, decoder, loader, [dec_opt, enc_opt])
            encoder = torch.load("best_encoder.pt")
            print(encoder.weight.sum())


        if __name__ == "__main__":
            main()
    '''
    result = _port_text(source)
    code = result.code
    # a module with no parameter that trains cannot be wrapped in DDP: only when its optimizer is made
    assert "encoder = ddpkit.wrap(encoder, ctx) if fine_tune else encoder\n" in code
    assert "decoder = ddpkit.wrap(nn.Linear(3, 1), ctx)" in code
    # the resume path binds the models again and trains them unwrapped; the load after training does not train
    assert sorted((t.line, t.message.split(" is bound")[0]) for t in result.todos) == [
        (28, "`decoder`"), (29, "`encoder`")], result.todos


def test_an_optimizer_made_every_epoch_wraps_once_and_a_second_one_that_may_follow_is_a_todo():
    source = '''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        model.weight.data.zero_()
        for epoch in range(3):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1 / (epoch + 1))
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    '''
    once = _port_text(source)
    assert once.todos == [] and once.code.count("ddpkit.wrap(") == 1
    assert "model = ddpkit.wrap(model, ctx)\nfor epoch in range(3):" in once.code
    twice = _port_text(source.replace("        for epoch in range(3):", "        if epoch_one := True:\n"
                                      "            head = torch.optim.SGD(model.parameters(), lr=1.0)\n"
                                      "        for epoch in range(3):"))
    assert [t.line for t in twice.todos] == [12] and "may be wrapped already" in twice.todos[0].message


def test_a_model_passed_to_the_function_that_makes_its_optimizer_is_wrapped_where_it_is_built():
    result = _port("model_passed_in")
    code = result.code
    assert result.todos == [] and lint_source(code, "model_passed_in_ddp.py") == []
    # after the checkpoint is loaded, once before the try: the retry in the except handler reuses the wrapper
    assert code.count("ddpkit.wrap(") == 1
    assert "    model = ddpkit.wrap(model, ctx)\n    try:\n        train_model(model=model" in code
    assert code.index("ddpkit.unwrap(model).load_state_dict(") < code.index("model = ddpkit.wrap(model, ctx)")
    assert '"inputs": ddpkit.unwrap(model).n_inputs' in code  # the parameter is a model in train_model
    assert "torch.save(ddpkit.unwrap(model).state_dict(), out)" in code
    tuple_built = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        device = "cuda" if torch.cuda.is_available() else "cpu"
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model, head = nn.Linear(4, 3).to(device), nn.Linear(3, 1)
        optimizer = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(head(model(x)), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''')
    assert tuple_built.todos == [], tuple_built.todos
    assert "model = ddpkit.wrap(model, ctx)\nhead = ddpkit.wrap(head, ctx)\noptimizer = " in tuple_built.code


def test_a_model_given_to_a_rank_zero_call_is_the_unwrapped_one():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.tensorboard import SummaryWriter

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter()
        writer.add_graph(model, torch.zeros(1, 4))
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''')
    assert result.todos == [], result.todos
    assert "if ctx.is_main:\n    writer.add_graph(ddpkit.unwrap(model), torch.zeros(1, 4, device=ctx.device))" in result.code


def test_a_model_built_by_a_function_of_its_name_calls_the_function_and_wraps_its_result():
    code = _port("builder_function").code
    # `net = net()`: on the right `net` is the builder function, never the wrapped model (TypeError if unwrapped)
    assert "net = ddpkit.wrap(net(), ctx)" in code and "ddpkit.unwrap(net)()" not in code
    assert "optimizer = torch.optim.SGD(net.parameters()" in code
    # inside train() the parameter `net` is the wrapped model from the first line: its forward stays wrapped
    assert "loss = loss_fn(net(x), y)" in code
    assert "def train(net, loader):\n    net.train()" in code  # its `net = net.to(device)`: the wrap moved it
    assert "ddpkit.unwrap(net).__class__.__name__" in code  # report(net)'s parameter is the model
    text = _port_text("""
        import torch
        import torch.nn as nn
        class model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
            def forward(self, x):
                return self.fc(x)
        model = model().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.randn(4, 3, 2):
            opt.zero_grad()
            model(x.cuda()).sum().backward()
            opt.step()
    """).code
    assert "model = ddpkit.wrap(model(), ctx)" in text and "ddpkit.unwrap(model)()" not in text
    # a function that builds, trains and saves its own model (it returns nothing): that model is the wrapped one
    trainer = _port_text("""
        import torch
        import torch.nn as nn
        def train():
            net = nn.Linear(2, 2).cuda()
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in torch.randn(4, 3, 2):
                opt.zero_grad()
                net(x.cuda()).sum().backward()
                opt.step()
            torch.save(net.state_dict(), "net.pt")
        train()
    """).code
    assert "torch.save(ddpkit.unwrap(net).state_dict(), \"net.pt\")" in trainer


def test_a_forward_whose_loss_reaches_backward_through_a_with_target_or_a_scaling_helper_stays_wrapped():
    result = _port("scaled_backward")
    code = result.code
    assert "logits = model(inputs + noise)" in code and "pred = model(inputs + noise)" in code
    assert "out = model(inputs)" in code  # `scale_and_step(err, opt)` runs backward itself
    # the look under no_grad reuses the name `out` of a training forward: it stays on the wrapper too (DDP allows
    # a forward without backward; it costs a buffer broadcast)
    assert "ddpkit.unwrap(model)(" not in code
    assert lint_source(code, "scaled_backward_ddp.py") == []


def test_a_method_of_the_model_that_trains_it_is_a_todo_naming_the_method():
    result = _port("fit_method")
    messages = [t.message for t in result.todos]
    # handed the optimizer at module level, outside any loop: the method runs its own training loop
    assert any(m.startswith("`ranker.learn(...)` trains through a method of the model") for m in messages)
    assert any(m.startswith("`ranker.refine(...)` trains through a method of the model") for m in messages)
    assert not any("ranker.score" in m for m in messages)  # no gradient step: read from the model itself
    assert "ddpkit.unwrap(ranker).score(" in result.code


def test_a_device_batch_handed_to_a_host_memory_library_is_a_todo():
    result = _port("host_library_batch")
    named = [t.message.split("`")[1:4:2] for t in result.todos if "reads host memory" in t.message]
    # `pixels` unpacked from the batch by position, `images` the loop's own target; `images.numpy()` is not
    # handed over as it is (its own .numpy() is the cpu() rule's), so only these two
    assert named == [["pixels", "random_noise"], ["images", "gaussian_filter"]]


def test_a_comprehension_variable_named_like_the_model_is_not_the_model():
    result = _port_text('''
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        class Small(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.size = 2

            def forward(self, x):
                return self.fc(x)

        class Big(Small):
            pass

        def main():
            models = {model.__name__: model for model in [Small, Big]}
            pick = sorted(models, key=lambda model: model.lower())[0]
            model = models[pick]()
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model.to(device)
            data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in DataLoader(data, batch_size=4, shuffle=True):
                optimizer.zero_grad()
                out = model(x.to(device))
                nn.functional.cross_entropy(out.view(-1, model.size), y.to(device)).backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
    ''')
    lines = [line.strip() for line in result.code.splitlines()]
    # the comprehension's and the lambda's `model` are classes and strings: unwrap() of either raises TypeError
    assert "models = {model.__name__: model for model in [Small, Big]}" in lines
    assert "pick = sorted(models, key=lambda model: model.lower())[0]" in lines
    assert any("ddpkit.unwrap(model).size" in line for line in lines)  # the instance itself still is


_DATA_PARALLEL_SIZES = '''
    import argparse
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def train(opt):
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=opt.batch_size,
                            shuffle=True, num_workers=opt.workers)
        model = nn.DataParallel(nn.Linear(4, 1)).cuda()
        if opt.saved_model:
            model.load_state_dict(torch.load(opt.saved_model), strict=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        steps = opt.steps
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch_size", type=int, default=16)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--saved_model", default="")
        parser.add_argument("--steps", type=int, default=100)
        opt = parser.parse_args()
        num_gpu = torch.cuda.device_count()
        opt.batch_size = opt.batch_size * num_gpu
        opt.workers *= max(num_gpu, 1)
        opt.steps = (1000 // (8 * num_gpu)) * 3
        train(opt)
'''


def test_sizes_multiplied_by_the_gpu_count_after_data_parallel_goes_are_named_where_the_meaning_changes():
    result = _port_text(_DATA_PARALLEL_SIZES)
    lines = [line.strip() for line in result.code.splitlines()]

    def above(statement: str) -> str:
        return lines[lines.index(statement) - 1]
    # the loader's batch: ddpkit.loader divides it by the world size, each rank gets the per-GPU batch
    assert above("opt.batch_size = opt.batch_size * num_gpu").startswith(
        "# ddpkit port: `opt.batch_size` is the batch DataParallel split over every GPU")
    # the loader's workers on each rank, and a step count: whole-machine figures each rank now takes for itself
    workers = above("opt.workers *= max(num_gpu, 1)")
    assert workers.startswith("# TODO(ddpkit port): `opt.workers *= max(num_gpu, 1)` multiplies by the GPU count")
    assert "`loader` (line 9) reads it too" in workers
    assert above("opt.steps = (1000 // (8 * num_gpu)) * 3").startswith(
        "# TODO(ddpkit port): `8 * num_gpu` multiplies by the GPU count (num_gpu)")
    assert "nn.DataParallel(" not in result.code
    ast.parse(result.code)


def test_a_lenient_load_into_a_model_that_was_a_data_parallel_names_the_module_prefix():
    result = _port_text(_DATA_PARALLEL_SIZES)
    todo = next(t.message for t in result.todos if "strict=False" in t.message)
    assert todo.startswith("`model` was an nn.DataParallel (line 11), which the port removed: checkpoints the "
                           "original saved from it hold `module.` keys")
    assert "consume_prefix_in_state_dict_if_present" in todo
    # the same load without strict=False fails loudly by itself, and one before the DataParallel read bare keys
    quiet = _port_text(_DATA_PARALLEL_SIZES.replace(", strict=False)", ")"))
    assert not any("module.` keys" in t.message for t in quiet.todos), quiet.todos
    before = _port_text(_DATA_PARALLEL_SIZES.replace(
        "model = nn.DataParallel(nn.Linear(4, 1)).cuda()\n        if opt.saved_model:\n"
        "            model.load_state_dict(torch.load(opt.saved_model), strict=False)",
        "model = nn.Linear(4, 1)\n        if opt.saved_model:\n"
        "            model.load_state_dict(torch.load(opt.saved_model), strict=False)\n"
        "        model = nn.DataParallel(model).cuda()"))
    assert not any("module.` keys" in t.message for t in before.todos), before.todos


def test_an_optimizer_over_a_module_list_whose_entries_are_called_is_a_todo_not_a_wrap():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
            student = nn.Linear(4, 8)
            head = nn.Linear(8, 1)
            trainable = nn.ModuleList([student])
            trainable.append(head)
            optimizer = torch.optim.SGD(trainable.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.mse_loss(trainable[1](trainable[0](x)), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
    ''')
    assert result.exit_code == 3
    assert "ddpkit.wrap(trainable" not in result.code  # DDP only averages through its own forward, never called here
    todo = next(t.message for t in result.todos if "ModuleList" in t.message)
    assert todo.startswith("the optimizer trains `trainable`, an nn.ModuleList (line 11)")
    assert "wrap each module it holds that trains" in todo
    ast.parse(result.code)


def test_an_optimizer_class_of_the_project_in_one_branch_wraps_the_model_there_too():
    # one branch per optimizer choice: the torch ones and the project's own classes (lr=, over model.parameters())
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from myopt import LookaheadSGD

        def main(opt_name):
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
            model = nn.Linear(4, 1)
            if opt_name == "mine":
                optimizer = LookaheadSGD(model.parameters(), lr=0.1, k=5)
            elif opt_name == "adam":
                optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()

        if __name__ == "__main__":
            main("mine")
    ''')
    code = result.code
    assert code.count("model = ddpkit.wrap(model, ctx)") == 2 and result.todos == []
    mine = code.split('if opt_name == "mine":', 1)[1].split("elif", 1)[0]
    assert mine.index("model = ddpkit.wrap(model, ctx)") < mine.index("LookaheadSGD(")


def test_a_branch_that_builds_the_optimizer_with_a_call_the_port_cannot_read_is_named():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        import myopt

        def main(opt_name):
            loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
            model = nn.Linear(4, 1)
            if opt_name == "mine":
                optimizer = myopt.build(model, 0.1)
            else:
                optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()

        if __name__ == "__main__":
            main("mine")
    ''')
    todos = [t for t in result.todos if "myopt.build" in t.message]
    assert len(todos) == 1 and todos[0].line == 11 and "(line 13)" in todos[0].message
    assert "# TODO(ddpkit port): `optimizer` is built here by `myopt.build(...)`" in result.code
    assert "unsynchronised" in todos[0].message and "model = ddpkit.wrap(model, ctx)" in todos[0].message


def test_an_ema_over_the_parameters_is_no_optimizer():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from torch_ema import ExponentialMovingAverage

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        ema = ExponentialMovingAverage(model.parameters(), decay=0.99)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            ema.update()
    ''')
    assert result.code.index("ema = ExponentialMovingAverage") < result.code.index("ddpkit.wrap(model, ctx)")
    assert result.todos == []


def test_apex_amp_initialize_after_the_wrap_is_named():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from apex import amp

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        model.weight.data.zero_()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    ''')
    named = [t for t in result.todos if "amp.initialize" in t.message]
    assert len(named) == 1 and named[0].line == 11 and "after" in named[0].message, result.todos
    assert "RuntimeError" in named[0].message and "model = ddpkit.wrap(model, ctx)" in named[0].message
    # torch's own autocast needs nothing
    plain = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                loss = nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    ''')
    assert not [t for t in plain.todos if "amp" in t.message]


def test_no_optimizer_in_the_file_says_to_wrap_once_the_weights_are_set_and_to_train_through_the_wrapper():
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from trainer import fit

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        fit(model, loader)
    ''')
    [todo] = [t.message for t in result.todos if t.message.startswith("no optimizer found")]
    assert "once its weights are set" in todo and "through calls of the wrapper" in todo
    assert "before its optimizer is made" not in todo  # an init after the optimizer would then walk the wrapper


def test_a_package_named_like_the_model_keeps_its_imports():
    # `from model.net import Net` beside a variable `model`, in the code the port runs under ddpkit.init (after
    # `sys.path.append`): the import names a package, not the wrapped model (it became `from ddpkit.unwrap(model).net`)
    source = textwrap.dedent("""\
        import sys
        sys.path.append("..")
        import torch
        from model.net import Net

        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
        for (x,) in loader:
            loss = model(x).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.load_state_dict(torch.load("best.pt"))
        """)
    result = port_source(source)
    assert "from model.net import Net\n" in result.code
    ast.parse(result.code)


def test_an_alias_of_the_wrapped_model_that_rank_0_alone_runs_is_unwrapped(tmp_path):
    # `best_model = model` after the wrap holds the DDP wrapper: a helper that writes files runs on rank 0 alone, and
    # its forward there is a collective (BatchNorm buffers are broadcast) the other ranks never join: a hang
    (tmp_path / "report.py").write_text(textwrap.dedent("""\
        import torch


        def save_outputs(net, name):
            torch.save(net(torch.zeros(2, 4)), name)
    """))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        from report import save_outputs

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        best_model = None
        best_loss = 1e9
        for epoch in range(3):
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if loss.item() < best_loss:
                best_loss = loss.item()
                best_model = model
        save_outputs(best_model, "best.pt")
    """))
    code = port_source(script.read_text(), str(script)).code
    assert "if ctx.is_main:\n    save_outputs(ddpkit.unwrap(best_model), " in code, code
    assert "best_model = None" in code  # the alias's first value is no module: unwrapped only where it is the model


def test_an_optimizer_over_a_slice_of_the_models_parameter_list_wraps_the_model():
    # `params = list(net.parameters())` then `SGD(params[4:])` (the first layers kept frozen): the model is the one
    # the slice comes from; it was left unwrapped with "cannot find the model", and the script's reads of what
    # forward stored on it (`net.loss`, `net.head.loss`) then went to the wrapper once the user wrapped it
    result = _port_text('''
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        net = Detector()
        net.train()
        params = list(net.parameters())
        opt = torch.optim.SGD(params[4:], lr=1e-3, momentum=0.9)
        for x, y in loader:
            net(x, y)
            loss = net.loss + net.head.loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        if 2 > 1:
            opt = torch.optim.SGD(params[4:], lr=1e-4)
    ''')
    code = result.code
    assert "cannot find the model" not in " ".join(t.message for t in result.todos)
    assert code.index("net = ddpkit.wrap(net, ctx)") < code.index("opt = torch.optim.SGD(params[4:]")
    assert "    net(x, y)\n" in code
    assert "loss = ddpkit.unwrap(net).loss + ddpkit.unwrap(net).head.loss" in code


def test_a_model_a_helper_wraps_and_returns_is_the_wrapper_in_the_caller_its_attributes_and_state_read_unwrapped():
    source = ("import torch\nfrom torch import nn, optim\nfrom torch.utils.data import DataLoader\n\n\n"
              "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.name = 'net'\n"
              "        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n        return self.fc(x)\n\n\n"
              "def get_model(lr):\n    model = Net()\n    optimizer = optim.Adam(model.parameters(), lr)\n"
              "    return model, optimizer\n\n\n"
              "def main():\n    model, optimizer = get_model(0.1)\n    path = f'models/{model.name}.pt'\n"
              "    for x in DataLoader(torch.zeros(8, 4), batch_size=4, shuffle=True):\n        optimizer.zero_grad()\n"
              "        model(x).sum().backward()\n        optimizer.step()\n"
              "    torch.save({'model_state_dict': model.state_dict()}, path)\n\n\n"
              "if __name__ == '__main__':\n    main()\n")
    code = port_source(source, "returned.py").code
    assert "model = ddpkit.wrap(Net(), ctx)" in code
    # in main, `model` is the DDP wrapper get_model returned: `.name` is the module's, its keys carry no `module.`
    assert "path = f'models/{ddpkit.unwrap(model).name}.pt'" in code
    assert "ddpkit.unwrap(model).state_dict()" in code
    assert "ddpkit.wrap(model, ctx)" not in code  # not wrapped a second time in the caller


def test_a_model_passed_in_to_the_optimizer_is_wrapped_after_its_loads_and_saved_unwrapped_says_the_todo():
    # the optimizer is made before pretrained weights are loaded: "wrap it where it is built" would put the wrap
    # before the load (into the wrapper, under `module.` keys) and leave saves of the wrapper's state_dict
    result = _port_text('''
        import torch
        from torch import nn


        def build_model():
            return nn.Linear(4, 4), nn.Linear(4, 1)


        def define_optimizer(g_model, d_model):
            return torch.optim.Adam(g_model.parameters()), torch.optim.Adam(d_model.parameters())


        if __name__ == "__main__":
            g_model, d_model = build_model()
            g_opt, d_opt = define_optimizer(g_model, d_model)
            g_model.load_state_dict(torch.load("pretrained.pt"))
            for step in range(3):
                g_opt.zero_grad()
                d_model(g_model(torch.randn(8, 4))).sum().backward()
                g_opt.step()
            torch.save(g_model.state_dict(), "g.pt")
    ''')
    assert result.exit_code == 3
    todo = next(t for t in result.todos if "the model g_model is passed in" in t.message)
    assert "after any loading of weights into it" in todo.message and "before the optimizer" not in todo.message
    assert "save ddpkit.unwrap(model).state_dict()" in todo.message


_GROUPS_TRAIN = '''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    {imports}

    {helper}
    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
        net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
        groups = {call}
        optimizer = torch.optim.SGD(groups, lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
'''
_DECAY = '''
    def add_weight_decay(model, weight_decay=1e-5):
        decay, no_decay = [], []
        for name, param in model.named_parameters():
            (no_decay if param.ndim == 1 else decay).append(param)
        return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]
'''


def test_an_optimizer_over_a_helpers_parameter_groups_wraps_the_module_handed_to_it(tmp_path):
    # the script's own helper, and one of its project imported by name, with the module passed by keyword
    own = _port_text(_GROUPS_TRAIN.format(imports="", helper=textwrap.indent(textwrap.dedent(_DECAY), "    "),
                                          call="add_weight_decay(net, 1e-4)"))
    (tmp_path / "optim_utils.py").write_text(textwrap.dedent(_DECAY))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_GROUPS_TRAIN.format(imports="from optim_utils import add_weight_decay",
                                                           helper="", call="add_weight_decay(model=net)")))
    project = port_source(script.read_text(), str(script))
    for result in (own, project):
        assert result.todos == [], [t.message for t in result.todos]
        code = result.code
        # wrapped after the groups are built: the same Parameter objects, named without `module.`
        assert code.index("add_weight_decay(") < code.index("net = ddpkit.wrap(net, ctx)") \
            < code.index("optimizer = torch.optim.SGD(groups")


def test_a_helper_reading_two_modules_leaves_the_optimizer_a_todo():
    helper = '''
    def both(a, b):
        return list(a.parameters()) + list(b.parameters())
    '''
    result = _port_text(_GROUPS_TRAIN.format(imports="", helper=textwrap.indent(textwrap.dedent(helper), "    "),
                                             call="both(net, nn.Linear(1, 1))"))
    assert any("cannot find the model this optimizer trains" in t.message for t in result.todos)
    assert "net = ddpkit.wrap(" not in result.code

"""The wrapped model handed to the project's own code: objects that hold it, values that hand it back, trainers
that keep it, and what that code then does to it as if it were the plain module."""

from __future__ import annotations

import textwrap

from ddpkit.port import port_source


def _todo_at(result, statement: str) -> str:
    lines = result.code.splitlines()
    found = [t.message for t in result.todos if t.in_output and lines[t.line - 1].strip() == statement]
    assert found, [(lines[t.line - 1].strip(), t.message[:80]) for t in result.todos]
    return found[0]


def _write(folder, files: dict[str, str]):
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


_NET = """\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 1)
            self.heads = 1

        def forward(self, x):
            return self.fc(x)
"""


_RUNNER = _NET + """\
    import labels


    class Runner:
        def __init__(self, model, loader):
            self.model = model
            self.loader = loader
            self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        def fit(self):
            self.model = self.model.to(self.dev)
            optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            for x, y in self.loader:
                loss = (self.model(x.to(self.dev)) - y.to(self.dev)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            labels.relabel(self)


    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        runner = Runner(Net(), loader)
        runner.fit()


    if __name__ == "__main__":
        main()
    """
"""A script whose runner keeps the model on `self` and hands itself to the project's `labels.relabel`."""


def test_an_object_holding_the_wrapper_handed_to_a_helper_that_sets_and_reads_model_attributes_is_a_todo(tmp_path):
    _write(tmp_path, {"labels.py": """\
        def relabel(self):
            self.model.heads = 1
            head = getattr(self.model, "head%d" % 0)
            return head
    """, "train.py": _RUNNER})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    assert "ddpkit.wrap(" in result.code
    todo = _todo_at(result, "labels.relabel(self)")
    assert "labels.py:2 sets `self.model.heads` on the DDP wrapper" in todo
    assert "labels.py:3 `getattr(self.model, 'head%d' % 0)` is no attribute of the DDP wrapper" in todo


def test_a_src_layout_trainer_is_read_and_the_model_it_hands_back_is_still_the_wrapper(tmp_path):
    _write(tmp_path, {"src/kit/__init__.py": "", "src/kit/io.py": """\
        import torch


        def save(model, path):
            state = model.module.state_dict() if isinstance(model, torch.nn.DataParallel) else model.state_dict()
            torch.save(state, path)
    """, "src/kit/loop.py": """\
        from kit.io import save


        def fit(model, loader, optimizer):
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return model
    """, "scripts/train.py": _NET + """\
    from kit.loop import fit
    from kit.io import save


    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trained = fit(model, loader, optimizer)
        save(trained, "final.pt")


    if __name__ == "__main__":
        main()
    """})
    script = tmp_path / "scripts" / "train.py"
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, 'save(trained, "final.pt")')
    assert todo.startswith("not checked: `save` in io.py (read, not ported) gets the model")
    assert "io.py:5 `model.state_dict()` of the wrapped model: its keys start with `module.`" in todo
    assert "model.module.state_dict()" not in todo  # that branch unwraps it


def test_an_engine_class_a_trainer_builds_around_the_model_is_followed_to_its_static_step(tmp_path):
    _write(tmp_path, {"engines.py": """\
        import torch


        class Engine:
            def __init__(self, step, model, optimizer):
                self.step = step
                self.model = model
                self.optimizer = optimizer

            def run(self, loader):
                for batch in loader:
                    self.step(self, batch)


        class SampledEngine(Engine):
            @staticmethod
            def train(engine, batch):
                x, y = batch
                sample = engine.model.sample(x)
                reward = torch.FloatTensor([1.0]).to(y.device)
                loss = (engine.model(x) - y).pow(2).mean() * reward
                engine.optimizer.zero_grad()
                loss.backward()
                engine.optimizer.step()
                return sample
    """, "trainers.py": """\
        class Trainer:
            def __init__(self, engine_class, epochs):
                self.engine_class = engine_class
                self.epochs = epochs

            def fit(self, model, optimizer, loader):
                engine = self.engine_class(self.engine_class.train, model, optimizer)
                for _ in range(self.epochs):
                    engine.run(loader)
    """, "train.py": _NET + """\
    from engines import SampledEngine
    from trainers import Trainer


    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        model = Net().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = Trainer(SampledEngine, 2)
        trainer.fit(model, optimizer, loader)


    if __name__ == "__main__":
        main()
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, "trainer.fit(model, optimizer, loader)")
    assert todo.startswith("not checked: `Trainer.fit` in trainers.py (read, not ported) gets the ")
    assert "hands the model to `SampledEngine`: engines.py:19 `engine.model.sample` is no attribute of the DDP " \
           "wrapper" in todo
    assert "makes a CPU tensor" not in todo  # moved to the batch's device where it is made


def test_a_project_factory_that_wraps_its_model_in_data_parallel_two_calls_down_is_a_todo(tmp_path):
    _write(tmp_path, {"factory.py": """\
        import torch
        from torch import nn


        def _build(width):
            model = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 1))
            return torch.nn.DataParallel(model).cuda()


        def _checked(width):
            return _build(width)


        def create_model(width):
            return _checked(width)
    """, "train.py": _NET + """\
    import factory


    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        model = factory.create_model(8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, "model = ddpkit.wrap(factory.create_model(8), ctx)")
    assert "factory.py:7 `torch.nn.DataParallel(model)` wraps in nn.DataParallel" in todo


def test_parameter_groups_handed_to_the_optimizer_beside_the_model_are_a_todo():
    result = port_source(textwrap.dedent(_NET + """\


    def make_optimizer(model, extra_groups):
        return torch.optim.SGD([{"params": model.parameters()}, extra_groups], lr=0.1)


    def main():
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        model = Net().cuda()
        critic = nn.Linear(1, 1).cuda()
        optimizer = make_optimizer(model, {"params": critic.parameters(), "lr": 0.01})
        for x, y in loader:
            loss = (critic(model(x.cuda())) - y.cuda()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
    """))
    assert any(t.message.startswith("the optimizer at line 17 also trains the parameters in `extra_groups`, handed "
                                    "in by the caller of `make_optimizer`") for t in result.todos), \
        [t.message[:90] for t in result.todos]


def test_what_the_called_helper_does_to_the_wrapper_is_named_before_what_its_callees_do(tmp_path):
    _write(tmp_path, {"pins.py": """\
        import torch


        def place():
            a = torch.zeros(1, device="cuda:0")
            b = torch.zeros(1, device="cuda:1")
            c = torch.ones(1, device="cuda:2")
            d = torch.ones(1, device="cuda:3")
            e = torch.empty(1, device="cuda:4")
            return a, b, c, d, e
    """, "labels.py": """\
        from pins import place


        def relabel(self):
            place()
            heads = 1
            heads += 1
            heads += 1
            heads += 1
            heads += 1
            heads += 1
            self.model.heads = heads
    """, "train.py": _RUNNER})
    script = tmp_path / "train.py"
    result = port_source(script.read_text(), str(script))
    todo = _todo_at(result, "labels.relabel(self)")
    assert "more)" not in todo  # five pins and the attribute: every one is named, on a line of its own
    items = todo.split("\n")[1:]
    assert items[0].startswith("- labels.py:12 sets `self.model.heads` on the DDP wrapper"), items
    assert "cuda:4" in todo and len(items) == 6, items


def test_the_bare_model_handed_to_the_projects_code_before_the_wrap_is_not_called_the_wrapper(tmp_path):
    # an anchor-box coder reads the model's settings at build, before the optimizer (and so the wrap)
    _write(tmp_path, {"coder.py": """\
        class BoxCoder:
            def __init__(self, net):
                self.steps = net.steps
                self.sizes = net.sizes
        """})
    script = tmp_path / "train.py"
    body = """\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        from coder import BoxCoder


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.steps, self.sizes = 8, 16

            def forward(self, x):
                return self.fc(x)


        net = Net()
        {before}
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, shuffle=True)
        net.fc.weight.data.zero_()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        {after}
        for x, y in loader:
            optimizer.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            optimizer.step()
        """
    script.write_text(textwrap.dedent(body).format(before="coder = BoxCoder(net)", after=""))
    result = port_source(script.read_text(), str(script))
    assert "net = ddpkit.wrap(net, ctx)" in result.code
    assert not [t for t in result.todos if "DDP wrapper" in t.message], result.todos
    script.write_text(textwrap.dedent(body).format(before="", after="coder = BoxCoder(net)"))
    result = port_source(script.read_text(), str(script))
    assert [t for t in result.todos if "`net.steps` is no attribute of the DDP wrapper" in t.message], result.todos


def test_a_project_class_training_the_handed_model_through_another_method_than_forward_is_named(tmp_path):
    # a policy-gradient agent: the optimizer and the step live in the project's class, the loss goes through
    # `evaluate_actions`, never through forward (which a DDP wrapper needs to average the gradients)
    _write(tmp_path, {"agent.py": """\
        import torch.optim as optim


        class Updater:
            def __init__(self, policy, lr):
                self.policy = policy
                self.optimizer = optim.Adam(policy.parameters(), lr=lr)

            def update(self, states):
                values = self.policy.evaluate_actions(states)
                loss = values.pow(2).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        """})
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from agent import Updater


        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                raise NotImplementedError

            def evaluate_actions(self, x):
                return self.fc(x)


        policy = Policy()
        updater = Updater(policy, 0.1)
        for step in range(10):
            updater.update(torch.randn(8, 4))
        """))
    result = port_source(script.read_text(), str(script))
    message = _todo_at(result, "updater = Updater(policy, 0.1)")
    assert "`policy.evaluate_actions(...)` (agent.py:10)" in message and "agent.py:7" in message, message
    assert "forward" in message and "all-reduce" in message


def test_a_project_agent_stepping_the_handed_model_once_per_environment_step_is_named(tmp_path):
    _write(tmp_path, {"dqn.py": """\
        import torch


        class Agent:
            def __init__(self, env, policy_net, lr=0.1):
                self.env = env
                self.policy_net = policy_net.to("cpu")
                self.optimizer = torch.optim.Adam(self.policy_net.parameters(), lr=lr)

            def optimize(self, states):
                loss = self.policy_net(states).pow(2).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

            def train(self, episodes):
                for _ in range(episodes):
                    done = False
                    while not done:
                        state, done = self.env.step()
                        self.optimize(state)
        """})
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from dqn import Agent

        policy_net = nn.Linear(4, 2)
        agent = Agent(None, policy_net, lr=0.01)
        agent.train(10)
        """))
    result = port_source(script.read_text(), str(script))
    message = _todo_at(result, "agent = Agent(None, policy_net, lr=0.01)")
    assert "(dqn.py:8)" in message and "`while` loop (dqn.py:19)" in message and "same number of steps" in message
    # a trainer looping on its step count runs as many steps on every rank: nothing to name there
    counted = (tmp_path / "dqn.py").read_text().replace("done = False\n", "step = 0\n").replace(
        "while not done:", "while step < 100:").replace("state, done = self.env.step()", "state, step = self.env.step()")
    (tmp_path / "dqn.py").write_text(counted)
    assert not [t for t in port_source(script.read_text(), str(script)).todos if "trains `policy_net`" in t.message]

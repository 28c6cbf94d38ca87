"""What a value handed along says about ranks and epochs: a parameter every call gives the rank, a set_epoch in a
loop over loaders, a loader only code outside the program iterates, a sampler its function's callers drop."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_source


def _lint(code: str, rule: str) -> list[int]:
    """Lines of `code` where `rule` fires."""
    return [f.line for f in lint_source(textwrap.dedent(code), "train.py") if f.rule == rule]


def _line(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


# ---- a parameter every call gives the rank -------------------------------------------------------
RANK_AS_PARAMETER = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def fit(net, gpu_slot, batches):
        net.train()
        for step, batch in enumerate(batches):
            out = net(batch.cuda(gpu_slot)).sum()
            if gpu_slot == 0:
                print("step", step, "of", len(batches))
        print("pass finished")

    def worker(rank, world):
        dist.init_process_group("nccl", rank=rank, world_size=world)
        torch.cuda.set_device(rank)
        net = torch.nn.Linear(4, 4).cuda(rank)
        fit(net, rank, [torch.zeros(2, 4)] * 3)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=2, args=(2,))
"""


def test_a_parameter_every_call_gives_the_rank_is_the_rank():
    lines = _lint(RANK_AS_PARAMETER, "DDP008")
    assert _line(RANK_AS_PARAMETER, '"step", step') not in lines  # `gpu_slot == 0` is rank 0
    assert _line(RANK_AS_PARAMETER, '"pass finished"') in lines  # beside it, the unguarded print stays


def test_a_parameter_some_call_gives_a_constant_is_no_rank():
    code = RANK_AS_PARAMETER.replace('    if __name__ == "__main__":',
                                     '    def smoke():\n        fit(torch.nn.Linear(4, 4), 1, [])\n\n'
                                     '    if __name__ == "__main__":\n        smoke()')
    # the guard reader no longer reads `gpu_slot == 0` as a rank check, but one call still gives gpu_slot the
    # rank: the print's every-rank claim would rest on a guess, so it is left out (see lint/doubt.py)
    assert _line(code, '"step", step') not in _lint(code, "DDP008")
    assert _line(code, '"pass finished"') in _lint(code, "DDP008")


# ---- set_epoch in a loop over loaders ------------------------------------------------------------
LOOP_OVER_LOADERS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    class Runner:
        def __init__(self, sets):
            self.loaders = [DataLoader(s, sampler=DistributedSampler(s), batch_size=8) for s in sets]

        def one_epoch(self, epoch):
            for loader in self.loaders:
                loader.sampler.set_epoch(epoch)
            for batches in zip(*self.loaders):
                pass

        def fit(self, epochs, start):
            for epoch in range(epochs):
                for loader in self.loaders:
                    loader.sampler.set_epoch(start)
                self.one_epoch(epoch)

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        Runner([list(range(10))]).fit(3, 0)
        dist.destroy_process_group()
"""


def test_set_epoch_in_a_loop_over_loaders_takes_the_epoch_of_the_loop_around_it():
    lines = _lint(LOOP_OVER_LOADERS, "DDP001")
    assert _line(LOOP_OVER_LOADERS, "set_epoch(epoch)") not in lines  # the function's epoch parameter
    assert _line(LOOP_OVER_LOADERS, "set_epoch(start)") in lines  # the same value every epoch of the outer loop


# ---- a loader only code outside the program iterates ---------------------------------------------
DRIVEN_OUTSIDE = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from trainkit.data import endless

    def run(data, steps):
        sampler = DistributedSampler(data, shuffle=True)
        loader = DataLoader(data, sampler=sampler, batch_size=8)
        print(len(loader))
        batches = endless(loader)
        for step in range(steps):
            batch = next(batches)

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        for epoch in range(3):
            run(list(range(100)), 10)
        dist.destroy_process_group()
"""


def test_a_loader_only_code_outside_the_program_iterates_is_reported_as_resting_on_that_code():
    found = [f for f in lint_source(textwrap.dedent(DRIVEN_OUTSIDE), "train.py") if f.rule == "DDP001"]
    assert [f.line for f in found] == [_line(DRIVEN_OUTSIDE, "DistributedSampler(data")]
    assert "only by endless() from a module not linted" in found[0].message
    assert found[0].severity == "warning"


def test_a_loader_the_program_iterates_through_an_outside_wrapper_still_needs_set_epoch():
    for code in (DRIVEN_OUTSIDE.replace("batch = next(batches)", "for batch in batches:\n                pass"),
                 DRIVEN_OUTSIDE.replace("from trainkit.data import endless", "from itertools import cycle as endless")):
        assert _lint(code, "DDP001") == [_line(code, "DistributedSampler(data")]


# ---- a sampler its function's callers drop -------------------------------------------------------
DROPPED_SAMPLER = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def build(size):
        data = list(range(size))
        sampler = DistributedSampler(data, shuffle=True)
        return data, sampler

    def train():
        data, _ = build(100)
        loader = DataLoader(data, batch_size=8)
        for epoch in range(3):
            for batch in loader:
                pass

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        train()
        dist.destroy_process_group()
"""


def test_a_sampler_every_caller_drops_builds_no_loader():
    assert _lint(DROPPED_SAMPLER, "DDP001") == []


def test_a_sampler_a_caller_keeps_still_needs_set_epoch():
    code = DROPPED_SAMPLER.replace("data, _ = build(100)\n        loader = DataLoader(data, batch_size=8)",
                                   "data, sampler = build(100)\n"
                                   "        loader = DataLoader(data, sampler=sampler, batch_size=8)")
    # (reported at the loop that passes over its loader again, in another function than the sampler)
    assert _lint(code, "DDP001") == [_line(code, "for batch in loader")]


# ---- the device a checkpoint was saved from ------------------------------------------------------
EXPLICIT_DEVICES = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if __name__ == "__main__":
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group(backend="nccl")
        model = torch.nn.Linear(4, 4).to(torch.device(f"cuda:{local_rank}"))
        model = DDP(model, device_ids=[local_rank])
        model.load_state_dict(torch.load("ckpt.pt", map_location={"cuda:0": f"cuda:{local_rank}"}))
        dist.destroy_process_group()
"""


def test_a_map_location_key_is_the_device_saved_from_not_a_placement():
    assert _lint(EXPLICIT_DEVICES, "DDP012") == []
    code = EXPLICIT_DEVICES.replace('map_location={"cuda:0": f"cuda:{local_rank}"}', 'map_location="cuda:0"')
    # no set_device on this path, and the load itself puts every rank's checkpoint on GPU 0
    assert _lint(code, "DDP012") == [_line(code, "init_process_group"), _line(code, 'map_location="cuda:0"')]


# ---- a figure every rank computes over the whole data --------------------------------------------
WHOLE_DATA = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from speechdata import Clips

    class Mean:
        def __init__(self):
            self.total, self.count = 0.0, 0

        def update(self, x):
            self.total, self.count = self.total + x, self.count + 1

    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        net = torch.nn.Linear(4, 4).cuda()
        train_set, check_set = Clips("train"), Clips("dev")
        train_loader = DataLoader(train_set, sampler=DistributedSampler(train_set), batch_size=8)
        check_loader = DataLoader(check_set, batch_size=1)
        train_loss, check_loss = Mean(), Mean()
        for x in train_loader:
            loss = net(x).sum()
            train_loss.update(loss.item())
        for x in check_loader:
            loss = net(x).sum()
            check_loss.update(loss.item())
        if rank == 0:
            print(f"dev loss {check_loss.total / check_loss.count}")
            print(f"train loss {train_loss.total / train_loss.count}")
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


def test_a_loss_every_rank_computes_over_the_whole_data_is_the_runs():
    lines = _lint(WHOLE_DATA, "DDP006")
    assert _line(WHOLE_DATA, '"dev loss') not in lines  # an unsharded loader over a dataset that needs a sampler
    assert _line(WHOLE_DATA, '"train loss') in lines  # its own shard


def test_a_dataset_class_not_linted_and_never_under_a_sampler_may_shard_itself():
    code = WHOLE_DATA.replace('Clips("dev")', 'Shards("dev")')
    code = code.replace("from speechdata import Clips", "from speechdata import Clips, Shards")
    assert _line(code, '"dev loss') in _lint(code, "DDP006")


# ---- a setting named like a loss -----------------------------------------------------------------
LOSS_SETTING = """
    import torch
    import torch.distributed as dist
    from trainparts import Criterion, fit

    def main():
        dist.init_process_group("nccl")
        loss_terms = ["labels", "boxes"]
        criterion = Criterion(terms=loss_terms)
        stats = fit(criterion)
        if dist.get_rank() == 0:
            print({**stats, "terms": len(loss_terms)})
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


def test_a_constant_list_named_like_a_loss_is_a_setting_not_a_figure():
    assert _lint(LOSS_SETTING, "DDP006") == []
    code = LOSS_SETTING.replace('loss_terms = ["labels", "boxes"]', 'loss_terms = fit(None)')
    assert _lint(code, "DDP006") == [_line(code, "print(")]
    code = LOSS_SETTING.replace('loss_terms = ["labels", "boxes"]', 'loss_terms = {}\n        loss_terms["a"] = fit(None)')
    assert _lint(code, "DDP006") == [_line(code, "print(")]  # an empty literal filled later is a figure


# ---- an autograd Function that all-gathers -------------------------------------------------------
GATHERING_FUNCTION = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    class Collect(torch.autograd.Function):
        @staticmethod
        def forward(ctx, piece, world):
            out = [torch.empty_like(piece) for _ in range(world)]
            dist.all_gather(out, piece)
            return torch.cat(out)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    collect = Collect.apply

    def evaluate(net, data, world):
        loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False), batch_size=4)
        embeddings = []
        for x in loader:
            gathered = collect(net(x), world)
            embeddings.append(gathered)
        if dist.get_rank() == 0:
            recall = torch.cat(embeddings).norm(dim=1).mean()
            print("recall", recall)

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        evaluate(torch.nn.Linear(4, 4), torch.zeros(8, 4), dist.get_world_size())
        dist.destroy_process_group()
"""


def test_an_autograd_function_whose_forward_all_gathers_is_a_reduction():
    assert _line(GATHERING_FUNCTION, 'print("recall"') not in _lint(GATHERING_FUNCTION, "DDP006")
    code = GATHERING_FUNCTION.replace("dist.all_gather(out, piece)", "out = [piece] * world")
    assert _line(code, 'print("recall"') in _lint(code, "DDP006")


# ---- a mode flag whose arm starts the process group, read in another file -----------------------
MODE_FLAG_FILES = {
    "train.py": """
        import torch
        import torch.distributed as dist
        from saver import keep

        def main(cfg):
            if cfg.RUN.SPREAD:
                dist.init_process_group("nccl")
            net = torch.nn.Linear(4, 4)
            keep(cfg, net)

        if __name__ == "__main__":
            main(load_config())
    """,
    "saver.py": """
        import torch
        import torch.distributed as dist

        def keep(cfg, net):
            if cfg.RUN.SPREAD:
                if dist.get_rank() == 0:
                    torch.save(net.state_dict(), "net.pt")
            else:
                torch.save(net.state_dict(), "net.pt")
            torch.save(net.state_dict(), "last.pt")
    """,
}


def test_the_other_arm_of_a_flag_whose_arm_starts_the_group_elsewhere_is_one_process():
    from ddpkit.lint import lint_sources
    sources = {path: textwrap.dedent(code) for path, code in MODE_FLAG_FILES.items()}
    lines = {f.line for f in lint_sources(sources) if f.rule == "DDP004" and f.path == "saver.py"}
    saver = sources["saver.py"].splitlines()
    assert lines == {next(i for i, t in enumerate(saver, 1) if '"last.pt"' in t)}


# ---- the methods of an object only some ranks build ----------------------------------------------
OBJECT_ON_ONE_RANK = {
    "train.py": """
        import torch.distributed as dist
        from hub import Hub
        from worker import Worker

        def main():
            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
            if rank == world - 1:
                agent = Hub(world)
                agent.run(10)
            else:
                agent = Worker(rank)
                agent.run(10)
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """,
    "hub.py": """
        from tqdm import tqdm

        class Hub:
            def __init__(self, world):
                self.world = world

            def run(self, rounds):
                for step in tqdm(range(rounds)):
                    pass
    """,
    "worker.py": """
        class Worker:
            def __init__(self, rank):
                self.rank = rank

            def run(self, rounds):
                for step in range(rounds):
                    pass
    """,
}


def test_the_methods_of_an_object_built_under_a_rank_check_run_there_alone():
    from ddpkit.lint import lint_sources
    sources = {path: textwrap.dedent(code) for path, code in OBJECT_ON_ONE_RANK.items()}
    assert [f for f in lint_sources(sources) if f.rule == "DDP008"] == []
    sources["train.py"] = sources["train.py"].replace("    if rank == world - 1:\n", "    if world > 1:\n")
    assert [(f.path, f.line) for f in lint_sources(sources) if f.rule == "DDP008"] == [("hub.py", 9)]


# ---- a launcher of another file called in a function ---------------------------------------------
LAUNCHED_IN_A_FUNCTION = {
    "train.py": """
        import torch.distributed as dist
        from runner import launch

        def worker(rank, world):
            dist.init_process_group("gloo", rank=rank, world_size=world)
            print("worker up")
            dist.destroy_process_group()

        def main():
            print("launching")
            launch(worker, 2)

        if __name__ == "__main__":
            main()
    """,
    "runner.py": """
        import torch.multiprocessing as mp

        def launch(fn, world):
            if world > 1:
                mp.spawn(fn, nprocs=world, args=(world,))
            else:
                fn(0, 1)
    """,
}


def test_the_function_that_calls_a_spawning_launcher_of_another_file_is_the_parent():
    from ddpkit.lint import lint_sources
    sources = {path: textwrap.dedent(code) for path, code in LAUNCHED_IN_A_FUNCTION.items()}
    lines = {f.line for f in lint_sources(sources) if f.rule == "DDP008" and f.path == "train.py"}
    train = sources["train.py"].splitlines()
    assert lines == {next(i for i, t in enumerate(train, 1) if '"worker up"' in t)}

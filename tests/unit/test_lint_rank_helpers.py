"""Rank checks the linter reads from what a program's own code does: helpers, spawn indices, early returns."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_TOOLS_INIT = """
    from .comm import can_log, outdir_ready
"""

_TOOLS_COMM = """
    import os
    import torch.distributed as dist


    def _leader():
        if not dist.is_initialized():
            return False
        return dist.get_rank() == 0


    def can_log():
        return _leader()


    def outdir_ready(path):
        return os.path.isdir(path)
"""

_TRAIN = """
    import torch
    import torch.distributed as dist
    import tools


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 2)
        if tools.can_log():
            print("step done")
            torch.save(model.state_dict(), "model.pt")
        if tools.outdir_ready("out"):
            print("out is there")


    if __name__ == "__main__":
        main()
"""


def test_a_project_helper_two_calls_deep_is_read_as_the_rank_check_its_body_makes():
    found = _lint({"tools/__init__.py": _TOOLS_INIT, "tools/comm.py": _TOOLS_COMM, "train.py": _TRAIN})
    assert ("train.py", _line(_TRAIN, 'print("step done")'), "DDP008") not in found
    assert not any(rule == "DDP004" for _, _, rule in found)
    # trap: a helper whose answer does not depend on the rank guards nothing
    assert ("train.py", _line(_TRAIN, 'print("out is there")'), "DDP008") in found


_FORWARD = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def first_process():
        return dist.get_rank() == 0


    def main():
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
        for step in range(10):
            model(torch.randn(4, 2)).sum().backward()
            if first_process():
                with torch.no_grad():
                    model(torch.randn(4, 2))


    if __name__ == "__main__":
        main()
"""


def test_a_no_grad_ddp_forward_under_a_project_rank_helper_is_reported():
    found = _lint({"train.py": _FORWARD})
    assert ("train.py", _line(_FORWARD, "with torch.no_grad():") + 1, "DDP010") in found


_EARLY_RETURN = """
    import torch
    import torch.distributed as dist


    def checkpoint(model, epoch, rank):
        if rank != 0 or epoch % 5 != 0:
            return
        torch.save(model.state_dict(), "ckpt.pt")


    def snapshot(model, epoch):
        if epoch % 5 != 0:
            return
        torch.save(model.state_dict(), "snap.pt")


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.Linear(2, 2)
        for epoch in range(10):
            checkpoint(model, epoch, rank)
            snapshot(model, epoch)


    if __name__ == "__main__":
        main()
"""


def test_an_early_return_on_rank_or_another_condition_guards_the_rest():
    found = _lint({"train.py": _EARLY_RETURN})
    assert ("train.py", _line(_EARLY_RETURN, '"ckpt.pt"'), "DDP004") not in found
    assert ("train.py", _line(_EARLY_RETURN, '"snap.pt"'), "DDP004") in found  # trap: no rank arm


_SPAWN = """
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def work(device_id, world):
        dist.init_process_group("gloo", rank=device_id, world_size=world)
        if device_id == 0:
            print("worker up")
        dist.destroy_process_group()


    if __name__ == "__main__":
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = "29512"
        mp.spawn(work, args=(2,), nprocs=2)
"""

_SPAWN_REUSED = _SPAWN.replace('    if __name__ == "__main__":', '''    def report(rows):
        for device_id in rows:
            print(device_id)


    if __name__ == "__main__":''')


def test_the_spawn_index_is_the_rank_under_any_name():
    found = _lint({"train.py": _SPAWN})
    assert ("train.py", _line(_SPAWN, 'print("worker up")'), "DDP008") not in found
    # trap: where the file binds the same name to something else, the name says nothing about ranks
    found = _lint({"train.py": _SPAWN_REUSED})
    assert ("train.py", _line(_SPAWN_REUSED, 'print("worker up")'), "DDP008") in found


_MODE_SWITCH = """
    import torch
    import torch.distributed as dist


    class Evaluator:
        def __init__(self, cfg):
            self.cfg = cfg

        def run(self, total):
            if self.cfg.mode.gpu:
                dist.all_reduce(total)
            return total


    def main(cfg):
        dist.init_process_group("nccl")
        return Evaluator(cfg).run(torch.ones(1))
"""

_GPU_RANK = """
    import os
    import torch
    import torch.distributed as dist


    def main(args):
        args.gpu = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl")
        total = torch.ones(1)
        if args.gpu:
            dist.all_reduce(total)
        return total
"""


def test_a_gpu_switch_in_a_config_is_no_rank_check():
    found = _lint({"evaluate.py": _MODE_SWITCH})
    assert not any(rule == "DDP010" for _, _, rule in found)
    # trap: an attribute the program sets from the local rank still picks ranks
    found = _lint({"train.py": _GPU_RANK})
    assert ("train.py", _line(_GPU_RANK, "dist.all_reduce(total)"), "DDP010") in found


_EARLY_STOP = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(2, 2))
        stale = 0
        for epoch in range(100):
            model(torch.randn(4, 2)).sum().backward()
            score = torch.rand(1)
            dist.all_reduce(score)
            if rank == 0:
                stale = stale + 1 if score.item() < 0.5 else 0
                if stale >= 3:
                    break
            if score.item() > 10:
                break
            if rank == 0:
                for name in ("a", "b"):
                    if name == "a":
                        break


    if __name__ == "__main__":
        main()
"""


def test_a_break_on_rank_zero_alone_leaves_a_loop_the_other_ranks_stay_in():
    found = {line for path, line, rule in _lint({"train.py": _EARLY_STOP}) if rule == "DDP010"}
    stops = [i for i, line in enumerate(textwrap.dedent(_EARLY_STOP).splitlines(), 1) if line.strip() == "break"]
    assert stops[0] in found
    # traps: a break every rank takes, and one that leaves a loop only rank 0 runs
    assert stops[1] not in found and stops[2] not in found


_EVAL_HELPER = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def evaluate(net, batch):
        with torch.no_grad():
            return net(batch).sum()


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
        for epoch in range(3):
            model(torch.randn(4, 2)).sum().backward()
            if rank == 0:
                print(evaluate(model, torch.randn(4, 2)))
                print(evaluate(model.module, torch.randn(4, 2)))


    if __name__ == "__main__":
        main()
"""


def test_a_rank_zero_call_of_a_helper_doing_the_no_grad_ddp_forward_is_reported_at_the_call():
    found = {line for path, line, rule in _lint({"train.py": _EVAL_HELPER}) if rule == "DDP010"}
    assert _line(_EVAL_HELPER, "evaluate(model, torch") in found
    assert _line(_EVAL_HELPER, "evaluate(model.module") not in found  # trap: the unwrapped model


_STEP = """
    def fit_one(net, batch):
        net(batch).sum().backward()


    def log_one(batch):
        batch.sum().backward()
"""

_RESUME = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import steps


    def main(resume):
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(2, 2))
        start = 0
        first = 0
        if rank == 0 and resume:
            start = torch.load(resume)["epoch"]
            first = start
        for epoch in range(start, 10):
            steps.fit_one(model, torch.randn(4, 2))
        for epoch in range(first, 10):
            steps.log_one(torch.randn(4, 2, requires_grad=True))


    if __name__ == "__main__":
        main(None)
"""


def test_a_loop_bound_set_on_some_ranks_around_a_helper_doing_the_ddp_step_is_reported():
    found = {line for path, line, rule in _lint({"steps.py": _STEP, "train.py": _RESUME}) if rule == "DDP010"}
    assert _line(_RESUME, "for epoch in range(start") in found
    assert _line(_RESUME, "for epoch in range(first") not in found  # trap: the helper is not handed the DDP model


_METHOD = """
    import torch
    import torch.distributed as dist


    class Snapshot:
        def __init__(self, model):
            self.model = model

        def write(self, path):
            torch.save(self.model.state_dict(), path)

        def dump(self, path):
            torch.save(self.model.state_dict(), path)


    def keep(snap, path):
        snap.write(path)


    def main():
        dist.init_process_group("gloo")
        snap = Snapshot(torch.nn.Linear(2, 2))
        if dist.get_rank() == 0:
            keep(snap, "keep.pt")
        snap.dump("dump.pt")


    if __name__ == "__main__":
        main()
"""


def test_a_rank_check_at_the_call_site_is_carried_into_a_method_call():
    found = {line for path, line, rule in _lint({"train.py": _METHOD}) if rule == "DDP004"}
    saves = [i for i, line in enumerate(textwrap.dedent(_METHOD).splitlines(), 1) if "torch.save(" in line]
    assert saves[0] not in found
    assert saves[1] in found  # trap: the method every rank calls


_ENV_SPAWN = """
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(device_id, node, gpus):
        dist.init_process_group("nccl", init_method="env://", rank=node * gpus + device_id, world_size=gpus)
        if device_id == 0:
            torch.save({}, "ckpt.pt")


    if __name__ == "__main__":
        os.environ["MASTER_ADDR"] = ADDRESS
        os.environ["MASTER_PORT"] = "29513"
        mp.spawn(worker, args=(0, 2), nprocs=2)
"""


def test_an_env_init_method_leaves_the_address_to_master_addr():
    local = _ENV_SPAWN.replace("ADDRESS", '"localhost"')
    assert not any(rule == "DDP004" for _, _, rule in _lint({"train.py": local}))
    remote = _ENV_SPAWN.replace("ADDRESS", '"10.0.0.7"')  # trap: another machine may join
    assert ("train.py", _line(remote, "torch.save"), "DDP004") in _lint({"train.py": remote})


_MODULE_RANK = """
    import os
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])


    def setup():
        dist.init_process_group("nccl")
        local_rank = dist.get_rank()
        return local_rank


    def main():
        setup()
        torch.cuda.set_device(local_rank)


    def other():
        local_rank = dist.get_rank()
        torch.cuda.set_device(local_rank)


    if __name__ == "__main__":
        main()
        other()
"""


def test_a_name_a_function_never_assigns_reads_the_modules_value():
    found = {line for path, line, rule in _lint({"train.py": _MODULE_RANK}) if rule == "DDP012"}
    sets = [i for i, line in enumerate(textwrap.dedent(_MODULE_RANK).splitlines(), 1) if "set_device(" in line]
    assert sets[0] not in found
    assert sets[1] - 1 in found  # trap: the function's own local_rank is the global rank (reported where bound)


_BOTH_SIDES = """
    import torch.distributed as dist


    def run(rank, writer=None):
        print("epoch starts")
        if writer is not None:
            print("writing")


    def report(rank):
        print("report")


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if rank == 0:
            run(rank, writer=object())
            report(rank)
        else:
            run(rank)


    if __name__ == "__main__":
        main()
"""


def test_calls_on_both_sides_of_a_rank_check_run_the_function_on_every_rank():
    found = {line for path, line, rule in _lint({"train.py": _BOTH_SIDES}) if rule == "DDP008"}
    assert _line(_BOTH_SIDES, '"epoch starts"') in found
    # traps: the branch only the rank-0 call's writer opens, and a function only rank 0 calls
    assert _line(_BOTH_SIDES, '"writing"') not in found and _line(_BOTH_SIDES, '"report"') not in found

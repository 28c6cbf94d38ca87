"""The baseline: correct DistributedDataParallel written by hand, as the PyTorch tutorials teach it."""

import time

_T0 = time.perf_counter()
import contextlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

_IMPORT_S = time.perf_counter() - _T0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import Recorder, build_model, make_dataset, parse_args, save_params  # noqa: E402


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed + rank)
    model = DistributedDataParallel(build_model(args.seed))
    dataset = make_dataset(args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    k, total = args.accumulation_steps, args.warmup + args.steps + 1
    rec = Recorder(args, _IMPORT_S)
    steps, micro, epoch = 0, 0, 0
    while steps < total:
        sampler.set_epoch(epoch)
        for x, y in loader:
            micro += 1
            step_end = micro % k == 0
            # no_sync on all but the last micro-step: one all-reduce per optimizer step, not k
            sync = step_end or args.no_skip_sync
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = torch.nn.functional.cross_entropy(model(x), y) / k
                loss.backward()
            if step_end:
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                rec.step(loss * k)
                if steps == total:
                    break
        epoch += 1
    if args.save_params and rank == 0:
        save_params(model.module, args.save_params)
    rec.write(rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The same job with Lightning Fabric: Fabric(strategy='ddp'), setup, no_backward_sync."""

import time

_T0 = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from lightning_fabric import Fabric  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

_IMPORT_S = time.perf_counter() - _T0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import Recorder, build_model, make_dataset, parse_args, save_params  # noqa: E402


def main() -> None:
    args = parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy="ddp", num_nodes=1)
    fabric.launch()  # under torchrun this only sets up the process group
    torch.set_num_threads(args.threads)
    model = build_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(
        DataLoader(make_dataset(args.seed), batch_size=args.batch_size, shuffle=True, drop_last=True))
    k, total = args.accumulation_steps, args.warmup + args.steps + 1
    rec = Recorder(args, _IMPORT_S)
    steps, micro, epoch = 0, 0, 0
    while steps < total:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            micro += 1
            step_end = micro % k == 0
            with fabric.no_backward_sync(model, enabled=not (step_end or args.no_skip_sync)):
                loss = torch.nn.functional.cross_entropy(model(x), y) / k
                fabric.backward(loss)
            if step_end:
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                rec.step(loss * k)
                if steps == total:
                    break
        epoch += 1
    if args.save_params and fabric.global_rank == 0:
        save_params(model.module if hasattr(model, "module") else model, args.save_params)
    rec.write(fabric.global_rank, fabric.world_size)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

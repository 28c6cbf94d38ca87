"""No DDP: one process trains alone (the per-rank compute cost, and the scaling reference)."""

import time

_T0 = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

_IMPORT_S = time.perf_counter() - _T0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import Recorder, build_model, make_dataset, parse_args, save_params  # noqa: E402


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args.seed)
    dataset = make_dataset(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    k, total = args.accumulation_steps, args.warmup + args.steps + 1
    rec = Recorder(args, _IMPORT_S)
    steps, micro = 0, 0
    while steps < total:
        for x, y in loader:
            micro += 1
            loss = torch.nn.functional.cross_entropy(model(x), y) / k
            loss.backward()
            if micro % k == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
                steps += 1
                rec.step(loss * k)
                if steps == total:
                    break
    if args.save_params:
        save_params(model, args.save_params)
    rec.write(0, 1)


if __name__ == "__main__":
    main()

"""The same job with HuggingFace Accelerate: Accelerator, prepare, accumulate."""

import time

_T0 = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

_IMPORT_S = time.perf_counter() - _T0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import Recorder, build_model, make_dataset, parse_args, save_params  # noqa: E402


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulation_steps)
    torch.set_num_threads(args.threads)
    model = build_model(args.seed)
    loader = DataLoader(make_dataset(args.seed), batch_size=args.batch_size, shuffle=True, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    total = args.warmup + args.steps + 1
    rec = Recorder(args, _IMPORT_S)
    steps = 0
    while steps < total:
        for x, y in loader:
            with accelerator.accumulate(model):  # skips the all-reduce and opt.step between syncs
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)  # divides by gradient_accumulation_steps
                opt.step()
                opt.zero_grad(set_to_none=True)
            if accelerator.sync_gradients:
                steps += 1
                rec.step(loss)
                if steps == total:
                    break
    if args.save_params and accelerator.is_main_process:
        save_params(accelerator.unwrap_model(model), args.save_params)
    rec.write(accelerator.process_index, accelerator.num_processes)
    accelerator.end_training()


if __name__ == "__main__":
    main()

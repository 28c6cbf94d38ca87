"""The same job with ddpkit: init, wrap, loader, accumulate (launched with `ddpkit run`)."""

import time

_T0 = time.perf_counter()
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import ddpkit  # noqa: E402
from ddpkit.checkpoint.sharded import export_state_dict

# ddpkit's names load on first use; touch the ones this job uses so their cost counts as import time
ddpkit.init, ddpkit.wrap, ddpkit.loader, ddpkit.accumulate  # noqa: B018
_IMPORT_S = time.perf_counter() - _T0
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import Recorder, build_model, make_dataset, no_exchange_hook, parse_args  # noqa: E402


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with ddpkit.init(seed=args.seed) as ctx:
        model = ddpkit.wrap(build_model(args.seed), ctx, **json.loads(args.options))
        if args.no_exchange:  # every rank keeps its own gradients: what DDP costs without communication
            model.register_comm_hook(None, no_exchange_hook)
        data = ddpkit.loader(make_dataset(args.seed), ctx, batch_size=args.batch_size,
                             accumulation_steps=args.accumulation_steps)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        k, total = args.accumulation_steps, args.warmup + args.steps + 1
        rec = Recorder(args, _IMPORT_S)
        steps = 0
        while steps < total:
            for x, y in data:
                with ddpkit.accumulate(model, sync=data.step_end or args.no_skip_sync):
                    loss = torch.nn.functional.cross_entropy(model(x), y) / k
                    loss.backward()
                if data.step_end:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    steps += 1
                    rec.step(loss * k)
                    if steps == total:
                        break
        if args.save_params:  # every rank: a sharded model's parameters are gathered to rank 0
            export_state_dict(ctx, model, args.save_params)
        rec.write(ctx.rank, ctx.world_size)


if __name__ == "__main__":
    main()

"""GPU-path behaviour that real gloo ranks can show: DDP's first gradient bucket."""

from __future__ import annotations

import torch
from harness import RankInfo, run_ranks


def _bucket_sizes(info: RankInfo, options: dict) -> tuple[list[int], bool]:
    """Bytes of each gradient bucket DDP all-reduces in the second backward (in order; DDP puts every
    parameter in one bucket for the first and rebuilds its buckets after it), and whether DDP considers its
    bucket size its own default."""
    import ddpkit

    with info.init(seed=0) as ctx:
        torch.manual_seed(0)
        # 8 x 256 KiB of weights: more than the 1 MiB first bucket, much less than 25 MiB.
        model = ddpkit.wrap(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), ctx, comm=None,
                            **options)
        sizes = []

        def recording_hook(state, bucket):
            sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
            fut = torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0] / ctx.world_size)

        model.register_comm_hook(None, recording_hook)
        for _ in range(2):
            sizes.clear()
            model(torch.randn(4, 256)).sum().backward()
        return sizes, bool(model.bucket_bytes_cap_default)


def test_ddp_keeps_its_small_first_bucket_unless_a_bucket_size_is_given():
    default, explicit = (run_ranks(_bucket_sizes, 2, options, timeout=180) for options in ({}, {"bucket_cap_mb": 25}))
    sizes, is_default = default[0]
    # The 1 MiB first bucket: it closes with the layer that takes it past 1 MiB.
    assert is_default and len(sizes) >= 2 and sizes[0] <= 1024 * 1024 + 257 * 256 * 4, sizes
    sizes, is_default = explicit[0]
    assert not is_default and len(sizes) == 1, sizes  # 25 MiB given: everything in one bucket

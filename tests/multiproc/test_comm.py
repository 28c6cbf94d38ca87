"""wrap(comm=...): 16-bit gradient all-reduce averages like exact DDP up to 16-bit rounding."""

from __future__ import annotations

import pytest
import torch
from harness import RankInfo, run_ranks


def _grads(info: RankInfo):
    """Gradients of the same model and data under each comm option, in one process group."""
    import ddpkit

    out = {}
    with info.init(seed=0) as ctx:
        for comm in (None, "fp16", "bf16"):
            torch.manual_seed(5)
            model = ddpkit.wrap(torch.nn.Linear(32, 8), ctx, comm=comm)
            g = torch.Generator().manual_seed(100 + ctx.rank)  # different data on each rank
            model(torch.randn(16, 32, generator=g)).pow(2).sum().backward()
            out[comm] = [p.grad.clone() for p in ddpkit.unwrap(model).parameters()]
    return out


def test_compressed_allreduce_matches_exact_average_within_16_bit_rounding():
    results = run_ranks(_grads, 2)
    exact = results[0][None]
    assert all(torch.equal(a, b) for a, b in zip(exact, results[1][None]))
    for comm, rtol in (("fp16", 2e-3), ("bf16", 1e-2)):
        for rank in range(2):
            for g, e in zip(results[rank][comm], exact):
                torch.testing.assert_close(g, e, rtol=rtol, atol=rtol * float(e.abs().max()))
        assert all(torch.equal(a, b) for a, b in zip(results[0][comm], results[1][comm]))  # replicas agree
        assert any(not torch.equal(g, e) for g, e in zip(results[0][comm], exact))  # it did round


def test_comm_rejects_unknown_value_and_is_harmless_at_world_size_1():
    import ddpkit

    ctx = ddpkit.init(env=ddpkit.read_env())
    with pytest.raises(ValueError, match="comm='int8'.*'fp16' or 'bf16'"):
        ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="int8")
    assert isinstance(ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="fp16"), torch.nn.Linear)
    ctx.close()

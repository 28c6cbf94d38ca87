"""DDP010 for batches dealt to the ranks by stride (`batches[rank::world_size]`) without evening their count first:
the ranks' epochs differ in length and the longer ones wait in the last step's all-reduce."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program

_SOURCE = (PROGRAMS / "stride_shards" / "train.py").read_text()


def _ddp010(old: str, new: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": _SOURCE.replace(old, new)}) if f.rule == "DDP010"]


def test_a_sampler_dealing_batches_by_stride_is_reported():
    check_program("stride_shards")


def test_evened_batches_a_bounded_slice_or_no_ddp_is_no_finding():
    evened = "        batches = batches[:len(batches) - len(batches) % world_size]\n        self.batches ="
    assert _ddp010("        self.batches =", evened) == []
    assert _ddp010("batches[rank::world_size]", "batches[rank:len(batches) // world_size * world_size:world_size]") == []
    assert _ddp010("model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[local_rank])",
                   "model = torch.nn.Linear(8, 1).cuda()") == []


def test_samples_dealt_by_stride_and_batched_afterwards_are_no_finding():
    """Dealt samples grouped into batches later differ in batch count only when the counts cross a batch boundary."""
    grouped = "        return iter([self.batches[i:i + 10] for i in range(0, len(self.batches), 10)])"
    assert _ddp010("        return iter(self.batches)", grouped) == []
    assert _ddp010("DataLoader(data, batch_sampler=sampler)", "DataLoader(data, sampler=sampler)") == []

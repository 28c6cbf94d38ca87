"""Recall of the AC+AD round (DDP006): a metric calculator fed this rank's predictions and targets batch by batch
(`calc.step(preds, gts)`) holds this rank's shard; its result reported on rank 0 alone is rank 0's shard."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_EVAL = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from metrics import APCalculator


    def evaluate(model, test_set):
        loader = DataLoader(test_set, batch_size=8, sampler=DistributedSampler(test_set, shuffle=False))
        calc = APCalculator(0.25)
        preds, gts = [], []
        with torch.no_grad():
            for points, boxes in loader:
                preds.append(model(points.cuda()))
                gts.append(boxes)
        for p, g in zip(preds, gts):
            calc.step(p, g)
        result = calc.compute_metrics()
        if dist.get_rank() == 0:
            print(f"mAP {result['mAP']:.4f}")


    def main():
        dist.init_process_group("nccl")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 7).cuda())
        evaluate(model, torch.utils.data.TensorDataset(torch.zeros(64, 3), torch.zeros(64, 7)))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"evaluate.py": source}) if f.rule == "DDP006"
            and "sharded loader" in f.message]


def test_a_calculator_fed_this_rank_s_predictions_and_targets_reports_rank_zero_s_shard():
    line = next(i for i, text in enumerate(_EVAL.splitlines(), 1) if 'print(f"mAP' in text)
    assert _lines(_EVAL) == [line]


def test_an_object_given_one_value_per_step_is_not_a_fed_calculator():
    """`scheduler.step(val_loss)` takes one value: what the scheduler shows is not a shard figure."""
    single = _EVAL.replace("calc.step(p, g)", "calc.step(p)")
    assert _lines(single) == []

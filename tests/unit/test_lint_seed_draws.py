"""Recall of the AG+AH round (DDP014): what a program surely draws with a seed shared by the ranks (a model built
with a dropout rate, a pretrained BERT-family model) and a seed in the module code every spawned rank runs again."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import argparse

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from nets import Seq2Seq


    def run(rank, args):
        dist.init_process_group("nccl", rank=rank, world_size=2)
        torch.manual_seed(1234)
        model = MODEL
        model = torch.nn.parallel.DistributedDataParallel(model.cuda(rank), device_ids=[rank])
        for step in range(10):
            model(torch.ones(2, 4).cuda(rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--drop", default="0.2")
        mp.spawn(run, args=(parser.parse_args(),), nprocs=2)
""")


def _seed_lines(model: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": _TRAIN.replace("MODEL", model)}) if f.rule == "DDP014"]


def test_a_model_built_with_a_dropout_setting_draws_the_same_masks_on_every_rank():
    assert _seed_lines("Seq2Seq(hidden=256, dropout=float(args.drop))") == [13]
    assert _seed_lines("Seq2Seq(hidden=256, attention_dropout=0.2)") == [13]


def test_a_model_built_without_dropout_draws_nothing():
    assert _seed_lines("Seq2Seq(hidden=256, dropout=0.0)") == []
    assert _seed_lines("Seq2Seq(hidden=256, dropout=0.1 if args.drop else 0)") == []
    assert _seed_lines("Seq2Seq(hidden=256, drop_last=True)") == []
    # a setting the linted files do not declare may be 0
    assert _seed_lines("Seq2Seq(hidden=256, dropout=cfg.ATT_DROPOUT)") == []
    assert _seed_lines("Seq2Seq(hidden=256, dropout=float(args.drop))").count(13) == 1
    assert _seed_lines("Seq2Seq(hidden=256, dropout=float(args.dropout))") == []


def test_a_pretrained_bert_family_model_draws_dropout_but_its_tokenizer_does_not():
    assert _seed_lines("BertForMultipleChoice.from_pretrained('bert-base-uncased')") == [13]
    assert _seed_lines("(BertTokenizerFast.from_pretrained('bert-base-uncased'), torch.nn.Linear(4, 1))[1]") == []


_SPAWNED = textwrap.dedent("""
    import random

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torchvision import transforms

    random.seed(41)
    torch.manual_seed(41)
    AUGMENT = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])


    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda(rank), device_ids=[rank])
        model(torch.ones(2, 4).cuda(rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(run, args=(2,), nprocs=2)
""")


def test_a_module_level_seed_every_spawned_rank_runs_again_is_the_same_on_every_rank():
    found = [(f.line, f.severity) for f in lint_sources({"train.py": _SPAWNED}) if f.rule == "DDP014"]
    assert found == [(10, "warning")]


def _chosen_class_seed_lines(first: str, second: str) -> list[int]:
    chosen = ("    if args.large:\n"
              f"        model_cls = {first}\n"
              "    else:\n"
              f"        model_cls = {second}\n"
              "    model = model_cls.from_pretrained('bert-base-uncased')\n")
    source = _TRAIN.replace("    model = MODEL\n", chosen)
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP014"]


def test_a_pretrained_model_class_chosen_into_a_variable_draws_dropout():
    # `model_cls = BertForMaskedLM` ... `model_cls.from_pretrained(...)`: the class is followed through the assignment
    assert _chosen_class_seed_lines("BertForMaskedLM", "RobertaForMaskedLM") == [13]


def test_a_chosen_class_draws_dropout_only_where_every_choice_does():
    assert _chosen_class_seed_lines("BertForMaskedLM", "MyTinyNet") == []
    assert _chosen_class_seed_lines("BertTokenizerFast", "RobertaTokenizer") == []


def test_a_reseeding_before_the_training_loop_is_the_seed_reported():
    """`torch.manual_seed(1234)` then, before the loop, `torch.manual_seed(args.seed)`: the later one overrides the
    first, so it is the seed the training draws follow and the line to fix; a seeding inside the loop is a later
    phase's and leaves the report where it was."""
    reseeded = _TRAIN.replace("    model = MODEL\n", "    model = MODEL\n    torch.manual_seed(7)\n")
    found = [f.line for f in lint_sources({"train.py": reseeded.replace("MODEL", "Seq2Seq(dropout=0.3)")})
             if f.rule == "DDP014"]
    assert found == [15]
    in_loop = _TRAIN.replace("        model(torch.ones", "        torch.manual_seed(step)\n        model(torch.ones")
    found = [f.line for f in lint_sources({"train.py": in_loop.replace("MODEL", "Seq2Seq(dropout=0.3)")})
             if f.rule == "DDP014"]
    assert found == [13]

"""Mistakes the linter used to miss on every rank: tensors placed by the global rank, output of project helpers,
identical seeds."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS as FIXTURES, check_program as _check


def test_tensors_placed_on_the_gpu_numbered_by_the_global_rank():
    """`.to(dist.get_rank())`, `.cuda(dist.get_rank())` and `device=dist.get_rank()` index the node's GPUs by the
    global rank, as `set_device(rank)` does (DDP012)."""
    _check("global_rank_placement")


def test_a_seed_helper_called_alike_on_every_rank_is_reported_at_its_call():
    """`seed_all(args.seed)` on every rank, and a dataset that masks a random span sized by each sample
    (`random.randint(0, length - width)` with `length = len(tokens)`): reported where the seed is chosen (DDP014)."""
    _check("seed_helper_masks")


def test_dropout_under_the_same_seed_on_every_rank_is_a_note():
    """`torch.manual_seed(1)` on every rank and `nn.Dropout(0.3)` in the model: the same dropout masks on every
    rank, a milder loss of independence than identical augmentation (DDP014 note)."""
    _check("seed_dropout")


def _seed_findings(model: str, train: str) -> list:
    return [f for f in lint_sources({"model.py": model, "train.py": train}) if f.rule == "DDP014"]


def test_dropout_at_rate_zero_or_a_seed_per_rank_is_not_reported():
    model = (FIXTURES / "seed_dropout" / "model.py").read_text()
    train = (FIXTURES / "seed_dropout" / "train.py").read_text()
    assert _seed_findings(model.replace("nn.Dropout(0.3)", "nn.Dropout(0.0)"), train) == []
    per_rank = train.replace("torch.manual_seed(1)", "torch.manual_seed(1 + int(os.environ['RANK']))")
    assert _seed_findings(model, per_rank) == []

"""Code the linter used to take for code no rank runs, or for the parent's: a package whose `__init__.py` is not
linted, a subclass's method named like an abstract one of its base, and the `forward` of a model an mp.spawn
worker builds."""

from __future__ import annotations

from lint_markers import check_program as _check


def test_a_name_imported_from_a_package_whose_init_is_not_linted_comes_from_the_module_defining_it():
    """`from pipeline import make_loaders` with pipeline/loaders.py linted and pipeline/__init__.py not: the print
    in make_loaders runs on every rank (it used to be a library no one calls); pipeline/other.py stays apart."""
    _check("package_no_init")


def test_an_abstract_method_of_the_base_does_not_hide_the_subclass_method_of_its_name():
    """`@abstractmethod def run_epoch` in the base and `def run_epoch` in the subclass that `fit` calls: the
    subclass method and what it calls run (its bar used to be taken for code no rank runs)."""
    _check("abstract_trainer")


def test_the_forward_of_a_model_an_mp_spawn_worker_builds_runs_in_the_rank():
    _check("spawned_forward")


def test_a_function_called_on_rank_0_and_then_on_the_other_ranks_runs_on_every_rank():
    """`if rank == 0: load_corpus()` then `if rank != 0: load_corpus()` (another file, or the same one): its print
    repeats on every rank; write_index, called on rank 0 alone, stays guarded."""
    _check("both_sides")


def test_a_function_nested_in_another_runs_where_the_enclosing_one_calls_it():
    """`def encode(item):` inside `tokenize_all`, called there: its bar runs on every rank (a nested function's
    name is a local variable of the enclosing one, and used to leave it for code no rank runs)."""
    _check("nested_helper")


def test_a_logger_made_by_a_method_of_a_project_object_logs_on_every_rank():
    """`self.log = cfg.get_logger("runner")`, a method that returns `logging.getLogger(name)` without looking
    at the rank, after a dictConfig the same on every rank: its `info` repeats on every rank."""
    _check("config_logger")


def test_a_sampler_in_the_non_training_branch_of_a_split_test_is_an_evaluation_sampler():
    """`if split == "train": ... else: DistributedSampler(dataset, shuffle=shuffle)`: the else branch serves
    evaluation data, so its padding is reported (DDP006) and no set_epoch is asked of it (DDP001)."""
    _check("split_loader")


def test_rank_helpers_and_reductions_re_exported_by_a_package_init_are_followed():
    """`from helpers import chief, fold_losses` where helpers/__init__.py has `from .comm import *` and `from
    helpers.losses import fold_losses`: the guards `if chief():` / `helpers.chief()` and the reduced losses are seen
    (they used to be unknown names: every print and save under them was reported)."""
    _check("package_star_reexport")


def test_a_name_read_off_a_package_imported_under_an_alias_comes_from_the_module_defining_it():
    """`import kit.tools as tools` then `tools.WarmupCosine(...)`, with kit/tools/schedules.py linted and
    kit/tools/__init__.py not: the print in the schedule's constructor runs on every rank (the module used to be
    left out of the program); kit/tools/unused.py, which defines no name read, stays apart."""
    _check("package_module_alias")

"""Samplers whose loader is passed over again without set_epoch: built by a factory in another file, by a class's
set-up method beside samplers that do get set_epoch, or iterated by a generator that never stops (DDP001)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def test_a_loader_factory_on_a_folder_put_on_sys_path_is_reported_at_the_epoch_loop():
    """`from data import make_loaders` where lib/ is put on sys.path and lib/data/__init__.py (not linted)
    re-exports lib/data/loaders/build.py: the factory's shuffling sampler is found, and reported at the epoch loop
    that hands its loader to run_epoch() (the factory may be right for other callers)."""
    check_program("loader_factory")


def test_a_sampler_beside_samplers_given_set_epoch_is_reported_where_its_loader_is_passed_over_again():
    """set_epoch is called for `self.extra_sampler` only: the main loader's sampler and the sampler a helper returns
    for a generator's `while True:` loop are reported at the loops that pass over them again."""
    check_program("sampler_passes")


def test_a_set_epoch_on_a_sampler_not_known_by_name_silences_the_others():
    """`loader.sampler.set_epoch(epoch)` may reach any sampler: nothing is reported."""
    source = (PROGRAMS / "sampler_passes" / "train.py").read_text()
    source = source.replace("self.extra_sampler.set_epoch(self.extra_sampler.epoch + 1)",
                            "self.extra_loader.sampler.set_epoch(self.extra_sampler.epoch + 1)")
    assert [f for f in lint_sources({"train.py": source}) if f.rule == "DDP001"] == []


def test_a_loader_built_anew_on_every_pass_is_reported_at_its_sampler():
    """A factory called inside the epoch loop builds a fresh loader each pass: no loop passes over the same loader
    again, so the sampler itself is reported, as before."""
    source = (PROGRAMS / "loader_factory" / "tools" / "train.py").read_text()
    build = "train_loader, val_loader = make_loaders(batch_size=32)\n"
    source = source.replace("    " + build, "").replace(
        "        run_epoch(", "        " + build + "        run_epoch(")
    build = (PROGRAMS / "loader_factory" / "lib" / "data" / "loaders" / "build.py").read_text()
    found = [(f.path, f.line) for f in lint_sources({"tools/train.py": source, "lib/data/loaders/build.py": build})
             if f.rule == "DDP001"]
    assert found == [("lib/data/loaders/build.py", 11)]

"""Where DDP001 stands when set_epoch runs only under the mode flag, and DDP010 on an object's own counter."""

from pathlib import Path

from ddpkit.lint import lint_file, lint_sources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"


def _found(name: str, rule: str) -> list[tuple[int, str]]:
    return sorted((f.line, f.message) for f in lint_file(FIXTURES / name) if f.rule == rule)


def _line(name: str, needle: str) -> int:
    return next(i for i, text in enumerate((FIXTURES / name).read_text().splitlines(), 1) if needle in text)


def test_a_set_epoch_under_the_distributed_flag_is_no_finding_at_a_sampler_built_on_every_path():
    # the flag is set in every distributed run, so each one reshuffles; without it the run is one process
    name = "good_ddp001_sampler_on_every_path_eval_beside.py"
    assert _found(name, "DDP001") == []


def test_a_guarded_set_epoch_beside_an_unguarded_one_is_no_finding():
    name = "good_ddp001_sampler_on_every_path_eval_beside.py"
    code = (FIXTURES / name).read_text().replace(
        "        for (x,) in train_loader:\n",
        "        train_loader.sampler.set_epoch(epoch)\n        for (x,) in train_loader:\n", 1)
    assert not [f for f in lint_sources({"train.py": code}) if f.rule == "DDP001"]


def test_a_stop_on_the_objects_own_counter_is_not_a_figure_of_its_batch():
    name = "good_ddp010_counter_attribute_stop.py"
    assert _found(name, "DDP010") == []
    # the same stop on an attribute computed from the batch is still one rank's own decision
    code = (FIXTURES / name).read_text().replace(
        "                if self.iteration > self.max_iterations:\n                    break\n",
        "                if self.last_loss < 1e-3:\n                    break\n", 1)
    assert [f.line for f in lint_sources({"train.py": code}) if f.rule == "DDP010"] == [
        next(i for i, t in enumerate(code.splitlines(), 1) if "self.last_loss < 1e-3" in t) + 1]

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


def _output(sources: dict[str, str]) -> list[int]:
    return [f.line for f in lint_sources(sources) if f.rule == "DDP008"]


def _program(name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((FIXTURES / name).glob("*.py"))}


def test_loguru_with_its_default_handler_repeats_on_every_rank():
    """`from loguru import logger; logger.info(...)` in the training script and in an agent class every rank
    builds: loguru's default handler writes to sys.stderr in every process (DDP008)."""
    _check("loguru_default")


def test_loguru_debug_lines_show_on_every_rank_through_its_default_handler():
    """loguru's default handler shows every level from DEBUG up: `logger.debug(...)` and `logger.success(...)` repeat
    on every rank as `logger.info(...)` does (DDP008)."""
    for level in ("debug", "success"):
        sources = _program("loguru_default")
        sources["train.py"] = sources["train.py"].replace('logger.info("start training")',
                                                          f'logger.{level}("start training")')
        assert 19 in _output(sources), level


def test_loguru_set_up_by_the_program_is_left_alone():
    sources = _program("loguru_default")
    sources["train.py"] = sources["train.py"].replace(
        '    dist.init_process_group("nccl")\n',
        '    dist.init_process_group("nccl")\n    if local_rank != 0:\n        logger.remove()\n')
    assert _output(sources) == []


def test_a_library_logging_set_up_called_on_every_rank_shows_info_lines():
    """`init_logging()` imported from a library (not a file of the program), on every rank with nothing of the
    rank in its arguments: read by its name as showing INFO lines, and the finding says so (DDP008)."""
    _check("library_log_setup")
    found = [f for f in lint_sources(_program("library_log_setup")) if f.rule == "DDP008"]
    assert all("init_logging() at train.py:15" in f.message for f in found)


def test_a_logging_set_up_given_the_rank_or_defined_in_the_program_is_not_read_by_its_name():
    source = _program("library_log_setup")["train.py"]
    ranked = source.replace("    init_logging()\n", "").replace(
        '    dist.init_process_group("nccl")\n', '    dist.init_process_group("nccl")\n'
        '    init_logging(rank=dist.get_rank())\n')
    assert _output({"train.py": ranked}) == []
    own = source.replace("from robotlib.utils import init_logging\n", "\n\ndef init_logging():\n    pass\n")
    assert _output({"train.py": own}) == []


def test_module_code_of_a_spawning_script_a_verbose_scheduler_and_a_message_before_exit_0():
    """A module-level print in a script whose workers mp.spawn starts (the spawn start method runs the module again
    in every worker), `StepLR(..., verbose=True)` built by every rank, and a final message before `exit(0)` (a
    normal end, not the reason a process stops): all print world_size times (DDP008)."""
    _check("spawn_module_output")


def test_a_message_before_a_failing_exit_or_a_fork_start_is_not_reported():
    source = _program("spawn_module_output")["train.py"]
    assert 29 not in _output({"train.py": source.replace("exit(0)", "exit(1)")})
    forked = source.replace("nprocs=2)", 'nprocs=2, start_method="fork")')
    assert 12 not in _output({"train.py": forked})
    quiet = source.replace("verbose=True", "verbose=False")
    assert 21 not in _output({"train.py": quiet})


def test_coloredlogs_shows_info_lines_but_a_set_up_that_returns_a_file_logger_is_not_read_by_its_name():
    source = _program("library_log_setup")["train.py"]
    colored = source.replace("from robotlib.utils import init_logging\n", "import coloredlogs\n").replace(
        "init_logging()", 'coloredlogs.install(level="INFO")')
    assert _output({"train.py": colored}) == [19, 24]
    assert _output({"train.py": colored.replace('level="INFO"', 'level="WARNING"')}) == []
    returned = source.replace("    init_logging()\n", '    results = setup_logging(save_path="runs")\n').replace(
        "import init_logging", "import setup_logging")
    assert _output({"train.py": returned}) == []


def test_a_library_function_named_like_the_seed_helper_is_not_its_call():
    sources = _program("seed_helper_masks")
    sources["seeds.py"] = sources["seeds.py"].replace("def seed_all(value):", "def set_seed(value):")
    sources["train.py"] = sources["train.py"].replace("from seeds import seed_all", "from seeds import set_seed") \
        .replace("    seed_all(args.seed)  # lint-expect: DDP014 warning\n",
                 "    hub.set_seed(args.seed)\n    set_seed(args.seed)  # lint-expect: DDP014 warning\n") \
        .replace("import argparse\n", "import argparse\n\nimport hub\n")
    found = [f.line for f in lint_sources(sources) if f.rule == "DDP014"]
    lines = sources["train.py"].splitlines()
    assert found == [lines.index("    set_seed(args.seed)  # lint-expect: DDP014 warning") + 1]


def test_the_first_gpu_of_a_settings_list_is_one_gpu_for_every_rank():
    """`torch.device("cuda:{}".format(opt.gpu_ids[0]))` in a trainer every rank builds: the same GPU index on every
    rank, whatever set_device chose before (DDP012)."""
    _check("settings_first_gpu")


def test_a_settings_list_given_per_rank_renumbered_or_for_data_parallel_is_not_reported():
    sources = _program("settings_first_gpu")
    mark = "    opt = parser.parse_args()\n"
    variants = [mark + "    opt.gpu_ids = [int(os.environ['LOCAL_RANK'])]\n",
                mark + "    os.environ['CUDA_VISIBLE_DEVICES'] = os.environ['LOCAL_RANK']\n",
                mark + "    spare = nn.DataParallel(nn.Linear(4, 1), device_ids=opt.gpu_ids)\n"]
    for variant in variants:
        changed = dict(sources, **{"train.py": sources["train.py"].replace(mark, variant)})
        assert [f for f in lint_sources(changed) if f.rule == "DDP012"] == [], variant

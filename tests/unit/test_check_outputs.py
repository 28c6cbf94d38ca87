"""ddpkit check's output probes in one process: reported figures, files written, downloads (no ranks)."""

from __future__ import annotations

import builtins
import http.server
import json
import logging
import sys
import threading
import types
import urllib.request
from pathlib import Path

import pytest

from ddpkit.check.outputs import OutputProbes


def _line(text: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


@pytest.fixture
def probes():
    events = []
    probe = OutputProbes(lambda ev, **fields: events.append({"ev": ev, **fields}))
    original_print = builtins.print
    probe.install()
    try:
        yield probe, events
    finally:
        probe.uninstall()
    assert builtins.print is original_print


def _at(events, ev):
    return [(e["site"].rsplit("/", 1)[-1], e.get("channel") or e.get("what"), e.get("text") or e.get("path")
             or e.get("url")) for e in events if e["ev"] == ev]


def test_print_logging_json_and_tqdm_are_recorded_with_the_calling_line(probes, capsys):
    probe, events = probes
    from tqdm import tqdm

    print("test accuracy", 0.49)  # print site
    log = logging.getLogger("ddpkit-test-outputs")
    log.addHandler(logging.NullHandler())
    log.setLevel(logging.INFO)
    log.info("loss %.3f", 0.25)  # logging site
    logging.getLogger("ddpkit-test-silent").info("not shown 1.0")  # no handler, below WARNING: not shown
    json.dumps({"correct": 49})  # json site
    bar = tqdm(total=2, disable=True)
    bar.set_postfix(acc=0.5)  # tqdm site
    tqdm.write("written 3")  # tqdm.write site
    assert _at(events, "report") == [
        (_line("# print site"), "print", "test accuracy 0.49"),
        (_line("# logging site"), "logging", "loss 0.250"),
        (_line("# json site"), "json", '{"correct": 49}'),
        (_line("# tqdm site"), "tqdm", '{"acc": 0.5}'),
        (_line("# tqdm.write site"), "tqdm", "written 3"),
    ]
    assert "test accuracy 0.49" in capsys.readouterr().out  # the script's output is unchanged


def test_tensorboard_is_probed_when_imported_after_install(probes, tmp_path):
    probe, events = probes
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))  # writer site
    writer.add_scalar("val/acc", 0.49, 3)  # scalar site
    writer.close()
    assert (_line("# scalar site"), "tensorboard", "val/acc: 0.49") in _at(events, "report")
    assert (_line("# writer site"), "SummaryWriter log directory", str(tmp_path / "tb")) in _at(events, "write")


def test_trackers_and_torchvision_datasets_through_their_module_functions(probes):
    probe, events = probes
    mlflow = types.SimpleNamespace(log_metric=lambda key, value, step=None: None,
                                   log_metrics=lambda metrics, step=None: None, start_run=lambda **kw: None)
    wandb_init = types.SimpleNamespace(init=lambda **kw: None)

    class Run:
        def log(self, data, step=None):
            pass

    class MNIST:
        def __init__(self, root, train=True, transform=None, download=False):
            pass

    probe._mlflow(mlflow)
    probe._wandb_run(types.SimpleNamespace(Run=Run))
    probe._wandb_init(wandb_init)
    probe._torchvision(types.SimpleNamespace(MNIST=MNIST))
    mlflow.log_metric("acc", 0.49)  # mlflow site
    Run().log({"loss": 0.7})  # wandb site
    wandb_init.init(project="p")  # wandb.init site
    MNIST("data", download=True)  # torchvision site
    MNIST("data")  # no download asked: not recorded
    assert _at(events, "report") == [(_line("# mlflow site"), "mlflow", "acc: 0.49"),
                                     (_line("# wandb site"), "wandb", '{"loss": 0.7}')]
    assert _at(events, "write") == [(_line("# wandb.init site"), "wandb.init", "<W&B run of project 'p'>")]
    assert _at(events, "download") == [(_line("# torchvision site"), "torchvision dataset download",
                                        "MNIST(root='data', download=True)")]


def test_files_opened_for_writing_and_http_requests_are_recorded(probes, tmp_path):
    probe, events = probes
    (tmp_path / "in.txt").write_text("x")  # pathlib write site
    with open(tmp_path / "in.txt") as f:  # read: not recorded
        f.read()
    with open(tmp_path / "out.csv", "a"):  # append site
        pass

    class Opener:
        opener = open  # a builtin stored in a class is no method: the probe must not become one

    Opener().opener(tmp_path / "in.txt").close()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/in.txt"
        assert urllib.request.urlopen(url, timeout=10).read() == b"x"  # download site
    finally:
        server.shutdown()
        server.server_close()
    assert _at(events, "write") == [(_line("# pathlib write site"), "open(mode='w')", str(tmp_path / "in.txt")),
                                    (_line("# append site"), "open(mode='a')", str(tmp_path / "out.csv"))]
    assert _at(events, "download") == [(_line("# download site"), "GET request", url)]


def test_uninstall_restores_everything(tmp_path):
    events = []
    probe = OutputProbes(lambda ev, **fields: events.append(ev))
    saved = (builtins.print, builtins.open, json.dumps, logging.Logger.handle)
    probe.install()
    probe.uninstall()
    print("after 1.0")
    with open(tmp_path / "x", "w"):
        pass
    assert events == [] and (builtins.print, builtins.open, json.dumps, logging.Logger.handle) == saved
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)

"""A set of strings turned into an ordered sequence (a vocabulary, class indices, a file list): its order follows
each process's hash seed, so under torchrun every rank numbers the same strings differently."""

from __future__ import annotations

from ddpkit.port import port_source
from ddpkit.port.orders import order_of

_SCRIPT = """import torch
from torch.utils.data import DataLoader
{imports}


def main():
    text = open('data.txt').read()
{body}
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(list(range(8)), batch_size=4):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


if __name__ == '__main__':
    main()
"""


def _orders(code: str) -> list[str]:
    import ast
    tree = ast.parse(code)
    defn = tree.body[0]
    return [order_of(n, defn) for n in ast.walk(tree) if order_of(n, defn)]


def test_a_set_of_strings_made_into_a_sequence_or_an_index_is_named():
    assert _orders("def f(text):\n    chars = tuple(set(text))\n") == ["`tuple(set(text))`"]
    assert _orders("def f(text):\n    vocab = {c: i for i, c in enumerate(set(text))}\n") == ["`enumerate(set(text))`"]
    assert _orders("def f(lines):\n    words = list({w for l in lines for w in l.split()})\n") == [
        "`list({w for l in lines for w in l.split()})`"]
    assert _orders("def f(names):\n    uniq = set(names)\n    idx = dict(zip(uniq, range(len(uniq))))\n") == [
        "`zip(uniq, range(len(uniq)))`"]
    assert _orders("def f(root):\n    files = list(set(os.listdir(root)))\n") == ["`list(set(os.listdir(root)))`"]


def test_sorted_sets_sets_of_numbers_and_lookups_are_not_named():
    assert _orders("def f(text):\n    chars = tuple(sorted(set(text)))\n    n = len(set(text))\n") == []
    assert _orders("def f(labels):\n    ks = list(set(range(10)))\n    m = list(set([1, 2, 3]))\n") == []
    assert _orders("def f(text):\n    seen = set(text)\n    ok = 'a' in seen\n    s = sorted(seen)\n") == []
    assert _orders("def f(ids):\n    ids = list(set(ids))\n") == []  # nothing says these are strings


def test_a_vocabulary_built_in_the_script_from_a_set_is_a_todo():
    source = _SCRIPT.format(imports="", body="    chars = tuple(set(text))\n    char2int = {c: i for i, c in "
                                          "enumerate(chars)}")
    result = port_source(source, "train.py")
    assert "ported fully" not in result.message
    [todo] = [t for t in result.todos if "hash seed" in t.message]
    assert todo.message.startswith("`tuple(set(text))` orders a set of strings")
    assert "sorted(" in todo.message and "broadcast_object" in todo.message


def test_a_vocabulary_built_from_a_set_in_the_projects_code_is_named_at_the_call(tmp_path):
    (tmp_path / "prep.py").write_text(
        "def tokenize(text):\n    chars = tuple(set(text))\n    return {c: i for i, c in enumerate(chars)}\n\n\n"
        "def sorted_tokens(text):\n    return {c: i for i, c in enumerate(sorted(set(text)))}\n")
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(imports="import prep", body="    vocab = prep.tokenize(text)\n"
                                                                 "    other = prep.sorted_tokens(text)"))
    result = port_source(script.read_text(), str(script))
    todos = [t for t in result.todos if "hash seed" in t.message]
    assert [t.message.split(" on every rank")[0] for t in todos] == ["`prep.tokenize(text)` runs the project's code"]
    assert "prep.py:2 `tuple(set(text))`" in todos[0].message
    assert "ported fully" not in result.message


def test_a_sorted_vocabulary_in_the_script_is_not_named():
    source = _SCRIPT.format(imports="", body="    chars = sorted(set(text))\n    char2int = {c: i for i, c in "
                                          "enumerate(chars)}")
    assert not [t for t in port_source(source, "train.py").todos if "hash seed" in t.message]

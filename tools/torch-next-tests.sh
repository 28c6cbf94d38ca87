#!/usr/bin/env bash
# Run the unit tests and the multi-process tests that touch torch internals on another torch release,
# in a virtual environment of its own (.venv-torch-VERSION, git-ignored). .ci/run runs it on 2.15.0
# and on the floor release, 2.11.0; docs/releases.md says what ran where.
#
#   tools/torch-next-tests.sh 2.15.0                     # make .venv-torch-2.15.0 if needed, then run the tests
#   tools/torch-next-tests.sh 2.11.0 --setup-only        # only make the venv
#   tools/torch-next-tests.sh 2.15.0 -- -k rendezvous    # extra pytest arguments after --
#   .venv-torch-2.15.0/bin/python tools/torch_bug_repros.py   # then: does torch alone still need each patch?
#
# The CI pin stays in constraints.txt (torch 2.13.0, CPU build); this venv ignores it on purpose, and
# also the machine's own pip constraints (a global constraints file may cap torch below the release
# asked for): PIP_CONSTRAINT points at an empty file. torch is named on the same pip line as ddpkit,
# so installing ddpkit's dev extras never moves it. The PyPI wheels are CUDA builds: they run on the
# CPU, but each rank's `import torch` is slow, hence a list of multi-process tests, not all of them.
set -euo pipefail

cd "$(dirname "$0")/.."
MULTIPROC=(  # one test or two per patch in ddpkit.torchinternals; about 2.5 minutes on 2.15.0 here
    # bind_shared_store: a one-node job's stores listen on loopback only (pytorch/pytorch#173909)
    tests/multiproc/test_multinode.py::test_single_node_listens_on_loopback_only
    # check_each_join: nodes launched with other --nnodes or the same --node-rank fail at once, in one line
    tests/multiproc/test_multinode.py::test_nodes_launched_differently_all_fail_at_once_with_one_line
    tests/multiproc/test_multinode.py::test_rendezvous_timeout_is_one_line_naming_endpoint_nodes_timeout_and_fix
    # handler_with_node: --node-rank 0 holds global rank 0
    tests/multiproc/test_multinode.py::test_node_rank_0_holds_global_rank_0_whichever_node_starts_first
    # fresh_store_per_round: a restart after a killed rank gets a new store (pytorch/pytorch#135712)
    tests/multiproc/test_resume.py::test_sigkilled_rank_restarts_and_resumes_bit_identically
    # default_store: close()'s store barrier
    tests/multiproc/test_init_watchdog.py
    # flight_records: the watchdog sees a collective issued from C++
    tests/multiproc/test_hang.py::test_hang_in_a_collective_python_never_issued_is_seen_through_the_flight_recorder
)

version=""
setup_only=0
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --setup-only) setup_only=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        [0-9]*.[0-9]*) version="$1" ;;
        *) echo "torch-next-tests.sh: unknown argument $1; usage: tools/torch-next-tests.sh VERSION [--setup-only] [-- PYTEST_ARGS]" >&2
           exit 2 ;;
    esac
    shift
done
if [ -z "$version" ]; then
    echo "torch-next-tests.sh: no torch release given; usage: tools/torch-next-tests.sh VERSION (e.g. 2.15.0)" >&2
    exit 2
fi

venv=".venv-torch-$version"
if [ ! -x "$venv/bin/python" ]; then
    echo "== making $venv"
    python3 -m venv "$venv"
fi
: > "$venv/no-constraints.txt"
echo "== installing torch $version and ddpkit[dev] in $venv"
PIP_CONSTRAINT="$PWD/$venv/no-constraints.txt" "$venv/bin/pip" install -q -e '.[dev]' "torch==$version"
"$venv/bin/python" - "$version" <<'EOF'
import sys, torch
got = torch.__version__.split("+")[0]
print("== torch", torch.__version__)
sys.exit(0 if got == sys.argv[1] else f"torch-next-tests.sh: asked for torch {sys.argv[1]}, the venv has {got}")
EOF
[ "$setup_only" = 1 ] && exit 0

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit "${MULTIPROC[@]}" "${pytest_args[@]}"

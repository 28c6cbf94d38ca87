#!/usr/bin/env bash
# Run the unit tests (but lint's and port's, which read code without calling torch) and the multi-process tests that touch
# torch internals on another torch release,
# in a virtual environment of its own (.venv-torch-VERSION, git-ignored). .ci/run runs it on 2.15.0
# and on the floor release, 2.11.0; docs/releases.md says what ran where.
#
#   tools/torch-next-tests.sh 2.15.0                     # make .venv-torch-2.15.0 if needed, then run the tests
#   tools/torch-next-tests.sh 2.11.0 --setup-only        # only make the venv
#   tools/torch-next-tests.sh 2.15.0 -- -k rendezvous    # extra pytest arguments after --
#   tools/torch-next-tests.sh 2.11.0 --discard           # remove the venv afterwards (CI: one CUDA build on disk at a time)
#   .venv-torch-2.15.0/bin/python tools/torch_bug_repros.py   # then: does torch alone still need each patch?
#
# A CUDA build takes about NEED_GB of disk while it installs (the wheels, unpacked, and the venv; pip's
# cache is off, PIP_NO_CACHE_DIR=1). With less free space where the venv or pip's temporary files go,
# the script says so in one line and exits 3 without touching anything; .ci/run reports that run as
# "not run (disk)" by name in its summary.
#
# The CI pin stays in constraints.txt (torch 2.13.0, CPU build); this venv ignores it on purpose, and
# also the machine's own pip constraints (a global constraints file may cap torch below the release
# asked for): PIP_CONSTRAINT points at an empty file. torch is named on the same pip line as ddpkit,
# so installing ddpkit's dev extras never moves it. The PyPI wheels are CUDA builds: they run on the
# CPU, but each rank's `import torch` is slow, hence a list of multi-process tests, not all of them.
set -euo pipefail
NEED_GB=11  # measured: 9.2 GiB at the peak for 2.15.0 (+cu132), 2026-12-01

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
discard=0
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --setup-only) setup_only=1 ;;
        --discard) discard=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        [0-9]*.[0-9]*) version="$1" ;;
        *) echo "torch-next-tests.sh: unknown argument $1; usage: tools/torch-next-tests.sh VERSION [--setup-only] [--discard] [-- PYTEST_ARGS]" >&2
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
    # free space (GB) where the venv goes and where pip unpacks the wheels
    for place in "$PWD" "${TMPDIR:-/tmp}"; do
        free_gb=$(( $(df -Pk "$place" | awk 'NR==2 {print $4}') / 1048576 ))
        if [ "$free_gb" -lt "$NEED_GB" ]; then
            echo "torch-next-tests.sh: not run: installing torch $version (a CUDA build) needs about $NEED_GB GB free, $place has $free_gb GB; free some disk (old .venv-torch-* folders, pip's cache) and run it again" >&2
            exit 3
        fi
    done
    echo "== making $venv"
    python3 -m venv "$venv"
fi
[ "$discard" = 1 ] && trap 'rm -rf "$venv"' EXIT
: > "$venv/no-constraints.txt"
echo "== installing torch $version and ddpkit[dev] in $venv"
PIP_NO_CACHE_DIR=1 PIP_CONSTRAINT="$PWD/$venv/no-constraints.txt" "$venv/bin/pip" install -q -e '.[dev]' "torch==$version"
"$venv/bin/python" - "$version" <<'EOF'
import sys, torch
got = torch.__version__.split("+")[0]
print("== torch", torch.__version__)
sys.exit(0 if got == sys.argv[1] else f"torch-next-tests.sh: asked for torch {sys.argv[1]}, the venv has {got}")
EOF
[ "$setup_only" = 1 ] && exit 0

# The lint and port unit tests (tests/unit/test_lint*.py, test_port*.py: 876 of 1324 unit tests, most of their
# time) check source analysis and rewriting, which read code without calling torch (the few that then run a
# ported script at world size 1 go through the runtime the other unit tests cover); they run once, on the
# pinned torch, in the README's test command. Every other unit test (the runtime: init, wrap, loaders, checkpoints, precision,
# torch internals, the check's analysis) runs here.
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit --ignore-glob='tests/unit/test_lint*' \
    --ignore-glob='tests/unit/test_port*' "${MULTIPROC[@]}" "${pytest_args[@]}"

#!/usr/bin/env bash
# Run the tests that touch torch internals against the newest torch this project is checked on.
#
#   tools/torch-next-tests.sh                 # make .venv-next if needed, then run the tests below
#   tools/torch-next-tests.sh --setup-only    # only make the venv
#   tools/torch-next-tests.sh -- -k rendezvous   # extra pytest arguments after --
#   .venv-next/bin/python tools/torch_bug_repros.py   # then: does torch alone still need each patch?
#
# TORCH_NEXT (default 2.14.1) is the release installed; VENV (default .venv-next) where. The CI pin
# stays in constraints.txt (torch 2.13.0, CPU build); this venv ignores it on purpose. The PyPI
# wheel of 2.14.1 is the CUDA build: it runs on the CPU, but each rank's `import torch` is slow, so
# only these files run here, not the whole suite.
set -euo pipefail

cd "$(dirname "$0")/.."
TORCH_NEXT="${TORCH_NEXT:-2.14.1}"
VENV="${VENV:-.venv-next}"
TESTS=(
    tests/unit/test_torchinternals.py  # every private torch name ddpkit uses, and its version gate
    tests/unit/test_launch.py          # argv -> RunConfig -> torchrun argv; rendezvous node order and errors
    tests/unit/test_check_cli.py       # ddpkit check's torchrun argv, run --hang-timeout
    tests/unit/test_runtime_abort.py   # the error path aborts the process group (distributed_c10d._abort_process_group)
    tests/unit/test_precision.py       # GradScaler's scale tensor, fused optimizers' on-device skip
    tests/unit/test_watchdog_unfinished.py  # unfinished async collectives, the NCCL flight recorder's summary
    tests/multiproc/test_run.py        # ddpkit run end to end on c10d: ranks, failures, Ctrl+C, two jobs at once
    tests/multiproc/test_multinode.py  # several launchers on one machine: --node-rank order, --nnodes checks
    tests/multiproc/test_hang.py       # run --hang-timeout, the watchdog, runtime's store barrier at close
    tests/multiproc/test_check.py      # ddpkit check end to end
    tests/multiproc/test_comm.py       # gradient communication hooks on real gloo ranks
    # torchrun's agent SIGTERMs the ranks left once one has exited: a stopped rank must outlive it
    tests/multiproc/test_preemption.py::test_sigusr1_to_one_rank_under_ddpkit_run_stops_all_with_its_exit_code
    # a rank killed, torchrun restarts the group: the ranks' store is new in every round (pytorch/pytorch#135712)
    tests/multiproc/test_resume.py::test_sigkilled_rank_restarts_and_resumes_bit_identically
)

setup_only=0
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --setup-only) setup_only=1 ;;
        --) shift; pytest_args=("$@"); break ;;
        *) echo "torch-next-tests.sh: unknown argument $1; see the top of this script" >&2; exit 2 ;;
    esac
    shift
done

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_NEXT')" 2>/dev/null; then
    echo "== making $VENV with torch $TORCH_NEXT"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_NEXT"
fi
# Refreshes the editable install (and the dev tools) without touching torch.
"$VENV/bin/pip" install -q -e '.[dev]' "torch==$TORCH_NEXT"
"$VENV/bin/python" -c "import torch; print('== torch', torch.__version__)"
[ "$setup_only" = 1 ] && exit 0

exec "$VENV/bin/python" -m pytest -q "${TESTS[@]}" "${pytest_args[@]}"

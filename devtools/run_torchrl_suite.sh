#!/usr/bin/env bash
# TorchRL's own tests as an oracle for torchrl_fixes: run them on stock TorchRL, again
# with `-p devtools.torchrl_suite` (the fixes imported first), and list every test that
# passes on stock and not with the fixes (devtools/compare_junit.py).
#
# usage: devtools/run_torchrl_suite.sh TESTS VENV OUTDIR [pytest args...]
#   TESTS   the tests to run, inside a checkout of pytorch/rl that matches the TorchRL
#           installed in VENV, e.g. ~/rl/test/rb; pytest runs from the nearest folder
#           above it holding pytest.ini (the checkout's root, for its settings and
#           test/conftest.py), or from TESTS' parent without one
#   VENV    a virtual environment with torch, torchrl, tensordict and pytest
#   OUTDIR  where stock.xml, patched.xml, the logs and compare.txt are written
# ORACLE_ONLY=stock|patched|compare runs one step (the others' files must exist).
# The exit status is compare_junit.py's: 1 when a test is lost, 0 otherwise.
set -euo pipefail

if [ "$#" -lt 3 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
tests=$(realpath "$1")
venv=$(realpath "$2")
out=$3
shift 3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python="$venv/bin/python"
mkdir -p "$out"
out=$(realpath "$out")

root=$(dirname "$tests")
probe=$tests
while [ "$probe" != / ]; do
    if [ -f "$probe/pytest.ini" ]; then root=$probe; break; fi
    probe=$(dirname "$probe")
done
cd "$root"

# -P: the current folder (a source checkout may hold torchrl/) is not put on sys.path,
# so `import torchrl` finds the installed package; checked here before anything runs.
location=$(env -u PYTHONPATH "$python" -P -c 'import torchrl; print(torchrl.__file__)')
case "$location" in
    "$root"/*) echo "torchrl imports from the checkout ($location), not from $venv" >&2; exit 2 ;;
esac
echo "tests $tests (from $root); torchrl $location"

run() {  # run NAME [extra args...]
    local name=$1
    shift
    echo "$name run -> $out/$name.log"
    nice -n 10 "$python" -P -m pytest "${tests#"$root"/}" -p no:cacheprovider -q -rfE \
        -o junit_family=xunit1 --junitxml="$out/$name.xml" "$@" >"$out/$name.log" 2>&1 || true
    tail -n 1 "$out/$name.log"
}

only=${ORACLE_ONLY:-}
if [ -z "$only" ] || [ "$only" = stock ]; then
    (unset PYTHONPATH TORCHRL_FIXES; run stock "$@")
fi
if [ -z "$only" ] || [ "$only" = patched ]; then
    (export PYTHONPATH="$repo"; unset TORCHRL_FIXES; run patched -p devtools.torchrl_suite "$@")
    head -n 1 "$out/patched.log"
fi
if [ -n "$only" ] && [ "$only" != compare ]; then
    exit 0  # one run asked for: the comparison waits for the other's file
fi
"$python" "$repo/devtools/compare_junit.py" "$out/stock.xml" "$out/patched.xml" | tee "$out/compare.txt"
exit "${PIPESTATUS[0]}"

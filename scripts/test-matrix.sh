#!/usr/bin/env bash
# The test suite on every Python the project claims (requires-python >= 3.10), each in its own
# virtual environment built by scripts/setup.sh. Run by `make test` after the main suite.
#
#   FULL_PYTHONS   versions (an empty value: none) that get the whole suite but the `slow` tests, with torch and TRL
#                  (default: 3.11 3.12; GPU images ship 3.12)
#   CORE_PYTHONS   versions that get the torch-free tests: import, CLI, scoring, bans, judge,
#                  and the content fuzz (default: 3.10 3.13)
#
# The interpreter already tested by the main suite (.venv) is skipped. An interpreter that is
# missing is reported and the others still run; under CI (CI=true) a missing one fails the run.
# Downloaded wheels are shared through pip's cache, so each environment is built quickly after
# the first.
#
#   --prepare      only build the environments (`make test` runs this beside the main suite, so
#                  that the builds, mostly waiting on pip, cost no time of their own)
set -uo pipefail
cd "$(dirname "$0")/.."
PREPARE=false
[ "${1:-}" = "--prepare" ] && PREPARE=true

FULL_PYTHONS=${FULL_PYTHONS-3.11 3.12}
CORE_PYTHONS=${CORE_PYTHONS-3.10 3.13}
CORE_TESTS=(tests/test_import.py tests/test_content_fuzz.py tests/test_judge_values.py
            tests/test_judge_isolation.py tests/test_scoring.py tests/test_cli.py tests/test_extract.py
            tests/test_bans.py tests/test_builtin_tasks.py tests/test_generic_task.py tests/test_hacks.py
            tests/test_environments.py tests/test_environment_bases.py plugins/humaneval/tests/test_humaneval.py
            --deselect tests/test_cli.py::test_train_with_a_model_that_cannot_be_loaded_is_a_one_line_error)
MAIN=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)

find_python() {  # find_python 3.12 -> path of an interpreter of that version, or nothing
  local v=$1 candidate
  for candidate in "python$v" $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r); do
    if command -v "$candidate" >/dev/null 2>&1 && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

failed=()
missing=()
summary=()
run_version() {  # run_version VERSION SCOPE
  local v=$1 scope=$2 py venv=".venv-py$1"
  if [ "$v" = "$MAIN" ]; then
    summary+=("python $v: the main suite (.venv)")
    return
  fi
  if ! py=$(find_python "$v"); then
    echo "test-matrix: Python $v not found (install it, e.g. \`pyenv install $v\`); skipping it" >&2
    missing+=("$v")
    return
  fi
  echo "== Python $v ($scope): $py" >&2
  if ! PYTHON="$py" VENV="$venv" SCOPE="$scope" bash scripts/setup.sh; then
    failed+=("$v (setup)")
    return
  fi
  if $PREPARE; then
    summary+=("python $v ($scope): environment ready")
    return
  fi
  local args=(-q -p no:cacheprovider -n "${TEST_WORKERS:-3}" --dist loadfile)
  if [ "$scope" = full ]; then
    args+=(-m "not gpu and not slow")
  else
    args+=("${CORE_TESTS[@]}")
  fi
  if "$venv/bin/python" -m pytest "${args[@]}"; then
    summary+=("python $v ($scope): passed")
  else
    failed+=("$v")
    summary+=("python $v ($scope): FAILED")
  fi
}

for v in $FULL_PYTHONS; do run_version "$v" full; done
for v in $CORE_PYTHONS; do run_version "$v" core; done

echo "== test-matrix summary" >&2
for line in "${summary[@]}"; do echo "  $line" >&2; done
for v in "${missing[@]}"; do echo "  python $v: not installed" >&2; done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-matrix: failed on Python ${failed[*]}" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ] && [ "${CI:-}" = "true" ]; then
  echo "test-matrix: CI must test every claimed Python; missing: ${missing[*]}" >&2
  exit 1
fi

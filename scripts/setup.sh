#!/usr/bin/env bash
# Installs everything trl-sandbox needs into ./.venv, on a fresh Debian/Ubuntu machine.
# Idempotent: a second run only checks. Used by `make demo` and `make test`.
#
#   TORCH_SPEC   torch requirement to install when torch is missing (default: torch==2.13.0;
#                set e.g. TORCH_SPEC=torch to take the newest CUDA build on a GPU machine)
#   PYTHON       interpreter to build the venv with (default: python3)
#   EXTRAS       extras of trl-sandbox to install (default: test)
#   VENV         the virtual environment to build (default: .venv)
#   IO_LANGUAGES the I/O judge's other languages to install besides Python and C/C++, comma-separated
#                (java, rust, go, javascript), e.g. IO_LANGUAGES=java,rust bash scripts/setup.sh;
#                `make test` asks for all four, so that the tests judge programs in each
#   SCOPE        full (default): the project with every dependency, torch included;
#                core: the project and its plugins without torch/trl/transformers, for the
#                torch-free tests (import, CLI, scoring, content fuzz) on other Pythons
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-test}
VENV=${VENV:-.venv}
SCOPE=${SCOPE:-full}
case "$SCOPE" in full|core) ;; *) echo "setup: SCOPE must be full or core, not '$SCOPE'" >&2; exit 2 ;; esac

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

system_install() {  # system_install "DEBIAN_PACKAGE..." "FEDORA_PACKAGE..." (space-separated lists)
  if command -v apt-get >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086  # a list of packages
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $1 >/dev/null
  elif command -v dnf >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    $SUDO dnf install -y $2
  else
    echo "setup: install$(printf ' %s' $1) with your package manager" >&2
    exit 1
  fi
}

# 1. bubblewrap, the local sandbox.
if ! command -v bwrap >/dev/null 2>&1; then
  echo "setup: installing bubblewrap (the local sandbox)" >&2
  system_install bubblewrap bubblewrap
fi

# 1b. g++ and gcc, for C++ and C programs judged on stdin/stdout; other languages on request.
if ! command -v g++ >/dev/null 2>&1; then
  echo "setup: installing g++ (C and C++ programs for the I/O judge)" >&2
  system_install g++ gcc-c++
fi
# A toolchain counts where the local sandbox looks for it (it binds /usr, not e.g. ~/.cargo/bin);
# the missing ones are installed in one go.
in_sandbox() { (PATH=/usr/local/bin:/usr/bin:/bin; command -v "$1" >/dev/null 2>&1); }
DEBIAN_MISSING=""
FEDORA_MISSING=""
for language in $(echo "${IO_LANGUAGES:-}" | tr ',' ' '); do
  case "$language" in
    java) in_sandbox javac || { DEBIAN_MISSING+=" default-jdk-headless"; FEDORA_MISSING+=" java-latest-openjdk-devel"; } ;;
    rust) in_sandbox rustc || { DEBIAN_MISSING+=" rustc"; FEDORA_MISSING+=" rust"; } ;;
    go) in_sandbox go || { DEBIAN_MISSING+=" golang"; FEDORA_MISSING+=" golang"; } ;;
    javascript|js|node) in_sandbox node || { DEBIAN_MISSING+=" nodejs"; FEDORA_MISSING+=" nodejs"; } ;;
    python|cpp|c) ;;
    *) echo "setup: IO_LANGUAGES: unknown language '$language' (java, rust, go, javascript)" >&2; exit 2 ;;
  esac
done
if [ -n "$DEBIAN_MISSING" ]; then
  echo "setup: installing the I/O judge's toolchains:$DEBIAN_MISSING" >&2
  system_install "$DEBIAN_MISSING" "$FEDORA_MISSING"
fi

# 1c. With the test extras: umoci, which the environment-base tests use to cross-check the
#     project's own OCI unpacker (the library never needs it; without it that test is skipped),
#     and busybox, for the image the root filesystem tests build.
case ",$EXTRAS," in
  *,test,*)
    if ! command -v umoci >/dev/null 2>&1; then
      echo "setup: installing umoci (a cross-check for the OCI base tests)" >&2
      (system_install umoci umoci) || echo "setup: umoci not installed; its cross-check test will be skipped" >&2
    fi
    # busybox: the shell and tools of the small image the root filesystem tests build offline.
    if ! command -v busybox >/dev/null 2>&1; then
      echo "setup: installing busybox (the root filesystem tests' image)" >&2
      system_install busybox-static busybox
    fi ;;
esac

# 2. The virtual environment (Debian's system Python needs python3-venv for it).
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    echo "setup: installing python3-venv" >&2
    system_install python3-venv python3
    "$PYTHON" -m venv "$VENV"
  fi
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

# 3. torch first, pinned, so that a newer release with several GB of CUDA packages is not pulled
#    in as a dependency on a CPU machine.
if [ "$SCOPE" = full ] && ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  $PIP install -q "$TORCH_SPEC"
fi

# 4. The project and its plugins, editable.
STAMP="$VENV/.trl-sandbox-installed"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ -n "$(find plugins -name pyproject.toml -newer "$STAMP" 2>/dev/null)" ]; then
  # Plugins whose SDK does not support this interpreter (cwsandbox needs 3.11+) are left out.
  PLUGINS=()
  while read -r p; do
    [ -n "$p" ] && PLUGINS+=(-e "$p")
  done < <("$VENV/bin/python" scripts/core_deps.py --plugins)
  for p in plugins/*/; do
    case " ${PLUGINS[*]} " in *" $p "*) ;; *) echo "setup: skipping $p: it does not support $("$VENV/bin/python" -V)" >&2 ;; esac
  done
  if [ "$SCOPE" = full ]; then
    $PIP install -q -e ".[${EXTRAS}]" "${PLUGINS[@]}"
  else
    # Everything but the training stack: the project's own light dependencies, the plugins' SDKs
    # and the test tools, read from the pyproject files so that this list cannot drift.
    mapfile -t CORE_DEPS < <("$VENV/bin/python" scripts/core_deps.py "$EXTRAS")
    $PIP install -q "${CORE_DEPS[@]}"
    $PIP install -q --no-deps -e . "${PLUGINS[@]}"
  fi
  touch "$STAMP"
fi

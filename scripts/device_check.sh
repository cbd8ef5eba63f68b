#!/usr/bin/env bash
# The prepared GPU check (issue 5, item 6): the same run with engine=hf on CUDA at batch sizes 1, 8
# and 64, with and without the deterministic flags, one CPU run, then `evalrun nondet` over them;
# and the batch-invariance canary (issue 14, item 3) with engine=hf on CUDA (strict, off) and on CPU.
# Every run's workers also run the canary at start: `nondet` lists them per run.
#
# The GPU machine has PyTorch (CUDA), transformers, pyarrow and numpy but no vLLM, no Ray and no
# network. Prepare here first (copies the pure-Python packages evalrun needs beyond those into
# build/device-site, about 18 MB), then run on the device with `build/device-site` carried along:
#
#   scripts/device_check.sh --prepare                 # on the CPU machine
#   scripts/device_check.sh                           # on the GPU machine; results in $OUT (or build/device-out)
#
# Each determinism setting runs in its own process: torch.use_deterministic_algorithms and
# CUBLAS_WORKSPACE_CONFIG cannot be undone inside one. About 2 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=build/device-site

if [[ "${1:-}" == "--prepare" ]]; then
    src=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    rm -rf "$SITE" && mkdir -p "$SITE"
    for pkg in hydra omegaconf antlr4 rich markdown_it mdurl pygments click; do cp -r "$src/$pkg" "$SITE/"; done
    find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
    du -sh "$SITE"
    exit 0
fi

PY=${PYTHON:-python3}
OUT=${OUT:-build/device-out}
ROOT=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
LIMIT=${LIMIT:-200}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu LIMIT=10: a smoke test of this script without a GPU
evalrun() { "$PY" -m evalrun.cli "$@"; }

"$PY" - <<'EOF' | tee "$OUT/device.txt"
import torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF

common=(engine=hf cluster=inline "limit=$LIMIT" run.progress=false)
# one process per determinism setting; -m sweeps the batch size and the decoding
evalrun run -m "${common[@]}" "engine.device=$DEVICE" engine.max_num_seqs=1,8,64 decoding=greedy,sample \
    determinism=strict "run.root=$ROOT/strict" | tail -6 > "$OUT/runs-strict.txt"
evalrun run -m "${common[@]}" "engine.device=$DEVICE" engine.max_num_seqs=1,8,64 decoding=greedy,sample \
    determinism=off "run.root=$ROOT/off" | tail -6 > "$OUT/runs-off.txt"
evalrun run -m "${common[@]}" engine.device=cpu engine.max_num_seqs=64 decoding=greedy,sample \
    determinism=strict "run.root=$ROOT/cpu" | tail -2 > "$OUT/runs-cpu.txt"

# run lists: lines 1,3,5 greedy (batch 1, 8, 64), lines 2,4,6 sampled
pick() { sed -n "$2p" "$OUT/runs-$1.txt"; }
report() {  # name, runs...
    local name=$1; shift
    { echo "== $name"; evalrun nondet "$@" || true; } | tee -a "$OUT/nondet.txt"
    evalrun nondet "$@" --json > "$OUT/nondet-$name.json" || true
}
: > "$OUT/nondet.txt"
report gpu-strict-batch-1-8-64-greedy "$(pick strict 1)" "$(pick strict 3)" "$(pick strict 5)"
report gpu-off-batch-1-8-64-greedy "$(pick off 1)" "$(pick off 3)" "$(pick off 5)"
report gpu-strict-batch-1-8-64-sample "$(pick strict 2)" "$(pick strict 4)" "$(pick strict 6)"
report gpu-off-batch-1-8-64-sample "$(pick off 2)" "$(pick off 4)" "$(pick off 6)"
report gpu-strict-vs-off-64-greedy "$(pick strict 5)" "$(pick off 5)"
report gpu-vs-cpu-64-greedy "$(pick strict 5)" "$(pick cpu 1)"
report gpu-vs-cpu-64-sample "$(pick strict 6)" "$(pick cpu 2)"
report all-greedy "$(pick strict 1)" "$(pick strict 3)" "$(pick strict 5)" "$(pick off 1)" "$(pick off 3)" \
    "$(pick off 5)" "$(pick cpu 1)"
# the canary on demand, engine=hf (vLLM is not on the GPU machine): a table each (exit 1: not invariant)
canary() {  # name, overrides...
    local name=$1; shift
    { echo "== canary $name"; evalrun canary engine=hf "$@" || true; } | tee -a "$OUT/canary.txt"
    evalrun canary engine=hf "$@" --json > "$OUT/canary-$name.json" || true
}
: > "$OUT/canary.txt"
canary gpu-strict "engine.device=$DEVICE" determinism=strict
canary gpu-off "engine.device=$DEVICE" determinism=off
canary cpu-strict engine.device=cpu determinism=strict
tar -C "$ROOT" -czf "$OUT/runs.tar.gz" .
echo "device check done: $OUT"

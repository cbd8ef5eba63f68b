#!/usr/bin/env bash
# The prepared GPU check (docs/nondeterminism.md "The GPU check"): the default model with engine=hf on CUDA at batch
# sizes 1, 8 and 64, in float32 and bfloat16, with and without the deterministic flags, greedy and sampled; one run
# on the device machine's CPU; then `evalrun nondet` over them and against the CPU runs carried from the machine that
# prepared the check (one per instruction set, engine.cpu_isa), and the table of it all (scripts/nondet_table.py,
# the format of docs/nondeterminism.md's tables). Then the batch-invariance canary on CUDA (strict, off) and CPU.
#
# The GPU machine has PyTorch (CUDA), transformers, pyarrow and numpy but no vLLM, no Ray and no network:
#
#   scripts/device_check.sh --prepare     # here: build/device-site (the pure-Python packages evalrun needs beyond
#                                         # those, about 18 MB) and build/device-baseline (this machine's CPU runs)
#   scripts/device_check.sh               # on the GPU machine, both carried; results in $OUT (or build/device-out)
#   scripts/device_check.sh --dry-run     # here, in the test suite: the whole check on CPU at LIMIT=2, baseline too
#
# Each determinism setting runs in its own process: torch.use_deterministic_algorithms and CUBLAS_WORKSPACE_CONFIG
# cannot be undone inside one. About 4 minutes on an H200 (the budget is 10).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=build/device-site
BASELINE=${BASELINE:-build/device-baseline}
LIMIT=${LIMIT:-200}
mode=${1:-}

# the CPU runs the device's are compared with: engine=hf at batch 64 on this machine's processor, one per level
baseline() {  # directory, cluster, levels, python
    local dir=$1 cluster=$2 levels=$3
    rm -rf "$dir" && mkdir -p "$dir"
    "$4" -m evalrun.cli run -m engine=hf engine.device=cpu engine.max_num_seqs=64 "engine.cpu_isa=$levels" \
        decoding=greedy,sample determinism=strict "cluster=$cluster" "limit=$LIMIT" run.progress=false report=false \
        "run.root=$dir/runs" | tail -n $((2 * $(tr , '\n' <<< "$levels" | wc -l))) > "$dir/runs.abs"
    # paths relative to the checkout: the device machine's checkout is elsewhere; lines level by level, greedy first
    while read -r run; do realpath --relative-to=. "$run"; done < "$dir/runs.abs" > "$dir/runs.txt"
    echo "$levels" > "$dir/levels.txt" && rm "$dir/runs.abs"
}

if [[ "$mode" == "--prepare" ]]; then
    src=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    rm -rf "$SITE" && mkdir -p "$SITE"
    for pkg in hydra omegaconf antlr4 rich markdown_it mdurl pygments click; do cp -r "$src/$pkg" "$SITE/"; done
    find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
    levels=$(.venv/bin/python -c "from evalrun.pipeline import cpu_isa; print(','.join(cpu_isa.runs_here()))")
    baseline "$BASELINE" local "$levels" .venv/bin/python
    du -sh "$SITE" "$BASELINE"
    exit 0
fi

PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
if [[ "$mode" == "--dry-run" ]]; then  # nothing of a GPU needed: every step, on CPU, tiny
    PY=${PYTHON:-.venv/bin/python} DEVICE=cpu LIMIT=${DRY_LIMIT:-2}
    BASELINE=$(mktemp -d)/baseline
    baseline "$BASELINE" inline native "$PY"
elif [[ -n "$mode" ]]; then
    echo "usage: scripts/device_check.sh [--prepare | --dry-run]" >&2 && exit 2
fi
OUT=${OUT:-build/device-out}
ROOT=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
evalrun() { "$PY" -m evalrun.cli "$@"; }
[[ -f "$BASELINE/runs.txt" ]] || { echo "device_check: no $BASELINE/runs.txt (run --prepare first)" >&2; exit 2; }

"$PY" - <<'EOF' | tee "$OUT/device.txt"
import torch, transformers
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF
echo "limit $LIMIT; load average $(cut -d' ' -f1-3 /proc/loadavg); started $(date -u +%FT%TZ)" >> "$OUT/device.txt"

common=(engine=hf cluster=inline "limit=$LIMIT" run.progress=false report=false)
# one process per determinism setting; -m sweeps dtype (outermost), batch size, then the decoding (innermost)
for det in strict off; do
    evalrun run -m "${common[@]}" "engine.device=$DEVICE" engine.dtype=float32,bfloat16 engine.max_num_seqs=1,8,64 \
        decoding=greedy,sample "determinism=$det" "run.root=$ROOT/$det" | tail -12 > "$OUT/runs-$det.txt"
done
evalrun run -m "${common[@]}" engine.device=cpu engine.max_num_seqs=64 decoding=greedy,sample \
    determinism=strict "run.root=$ROOT/cpu" | tail -2 > "$OUT/runs-cpu.txt"

# runs-DET.txt: line 1 + 6*dtype + 2*batch + decoding (dtype 0 float32, 1 bfloat16; batch 0,1,2 = 1,8,64; decoding
# 0 greedy, 1 sample); runs-cpu.txt and the baseline: 1 + 2*level + decoding
gpu() { sed -n "$((1 + 6 * $2 + 2 * $3 + $4))p" "$OUT/runs-$1.txt"; }
cpu() { sed -n "$((1 + $1))p" "$OUT/runs-cpu.txt"; }
IFS=, read -r -a levels < "$BASELINE/levels.txt"
carried() { sed -n "$((1 + 2 * $1 + $2))p" "$BASELINE/runs.txt"; }
rows=()
: > "$OUT/nondet.txt"
report() {  # label, runs...
    local label=$1 file
    shift
    file="$OUT/nondet-$(tr -c 'a-zA-Z0-9\n' - <<< "$label").json"
    { echo "== $label"; evalrun nondet "$@" || true; } >> "$OUT/nondet.txt"
    if evalrun nondet --json "$@" > "$file"; then rows+=("$label=$file"); fi
}
for d in 0 1; do
    decoding=$([[ $d == 0 ]] && echo greedy || echo sample)
    for det in strict off; do
        report "gpu $det fp32, batch 1/8/64, $decoding" "$(gpu $det 0 0 $d)" "$(gpu $det 0 1 $d)" "$(gpu $det 0 2 $d)"
        report "gpu $det bf16, batch 1/8/64, $decoding" "$(gpu $det 1 0 $d)" "$(gpu $det 1 1 $d)" "$(gpu $det 1 2 $d)"
    done
    report "gpu strict vs off, fp32 batch 64, $decoding" "$(gpu strict 0 2 $d)" "$(gpu off 0 2 $d)"
    report "gpu fp32 vs bf16, strict batch 64, $decoding" "$(gpu strict 0 2 $d)" "$(gpu strict 1 2 $d)"
    report "gpu vs its machine's cpu, fp32 batch 64, $decoding" "$(gpu strict 0 2 $d)" "$(cpu $d)"
    for ((i = 0; i < ${#levels[@]}; i++)); do
        report "gpu vs carried cpu ${levels[i]}, fp32 batch 64, $decoding" "$(gpu strict 0 2 $d)" "$(carried "$i" $d)"
    done
done
"$PY" scripts/nondet_table.py "${rows[@]}" > "$OUT/table.md"
# the canary on demand, engine=hf: a table each (exit 1: not invariant)
canary() {  # name, overrides...
    local name=$1
    shift
    { echo "== canary $name"; evalrun canary engine=hf "$@" || true; } >> "$OUT/canary.txt"
    evalrun canary engine=hf "$@" --json > "$OUT/canary-$name.json" || true
}
: > "$OUT/canary.txt"
canary gpu-strict "engine.device=$DEVICE" determinism=strict
canary gpu-off "engine.device=$DEVICE" determinism=off
canary cpu-strict engine.device=cpu determinism=strict
echo "ended $(date -u +%FT%TZ)" >> "$OUT/device.txt"
tar -C "$ROOT" -czf "$OUT/runs.tar.gz" .
echo "device check done: $OUT ($(($(wc -l < "$OUT/table.md") - 2)) table rows)"

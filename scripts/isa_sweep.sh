#!/usr/bin/env bash
# The instruction-set sweep (docs/nondeterminism.md "Instruction sets"): one model and task run greedy and sampled
# with every worker's kernels capped at each level (engine.cpu_isa), then `evalrun nondet` on every pair of levels
# and on all of them, and the table of those reports.
#
#   scripts/isa_sweep.sh NAME [OVERRIDES...]      # e.g. tiny limit=200; smollm2 model=smollm2_135m_instruct ...
#
# LEVELS (default: the levels this processor runs, evalrun.pipeline.cpu_isa.runs_here), OUT (build/isa-sweep/NAME):
# the runs' list, the nondet reports (text and JSON) and table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
LEVELS=${LEVELS:-$(.venv/bin/python -c "from evalrun.pipeline import cpu_isa; print(','.join(cpu_isa.runs_here()))")}
OUT=${OUT:-build/isa-sweep/$name}
mkdir -p "$OUT"
evalrun() { .venv/bin/evalrun "$@"; }

echo "isa sweep $name: levels $LEVELS; load average $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)" \
    | tee "$OUT/sweep.txt"
# Hydra's sweep order: the level outermost, the decoding inside it (greedy, sample for each level)
evalrun run -m "engine.cpu_isa=$LEVELS" decoding=greedy,sample cluster=local \
    run.progress=false report=false "run.root=$OUT/runs" "$@" > "$OUT/run.log"
IFS=, read -r -a levels <<< "$LEVELS"
mapfile -t runs < <(tail -n $((2 * ${#levels[@]})) "$OUT/run.log")
run_of() {  # level index, decoding index (0 greedy, 1 sample)
    echo "${runs[$((2 * $1 + $2))]}"
}
: > "$OUT/nondet.txt"
rows=()
for d in 0 1; do
    decoding=$([[ $d == 0 ]] && echo greedy || echo sample)
    for ((i = 0; i < ${#levels[@]}; i++)); do
        for ((j = i + 1; j < ${#levels[@]}; j++)); do
            label="${levels[i]} vs ${levels[j]}, $decoding"
            file="$OUT/nondet-${levels[i]}-${levels[j]}-$decoding.json"
            { echo "== $label"; evalrun nondet "$(run_of "$i" "$d")" "$(run_of "$j" "$d")"; } >> "$OUT/nondet.txt"
            evalrun nondet --json "$(run_of "$i" "$d")" "$(run_of "$j" "$d")" > "$file"
            rows+=("$label=$file")
        done
    done
    all=()
    for ((i = 0; i < ${#levels[@]}; i++)); do all+=("$(run_of "$i" "$d")"); done
    label="all ${#levels[@]} levels, $decoding"
    { echo "== $label"; evalrun nondet "${all[@]}"; } >> "$OUT/nondet.txt"
    evalrun nondet --json "${all[@]}" > "$OUT/nondet-all-$decoding.json"
    rows+=("$label=$OUT/nondet-all-$decoding.json")
done
.venv/bin/python scripts/nondet_table.py "${rows[@]}" | tee "$OUT/table.md"
echo "isa sweep $name done: $OUT ($(date -u +%FT%TZ); load average $(cut -d' ' -f1-3 /proc/loadavg))" \
    | tee -a "$OUT/sweep.txt"

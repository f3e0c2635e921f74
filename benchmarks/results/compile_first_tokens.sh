#!/bin/bash
# QUIET="benchmarks/quiet.sh" waits for a quiet machine before each run (what the committed table used).
# Cold / warm time to the first 32 tokens, 4 and 32 layers, each MODE (default: whole regional; whole =
# the compile before issue #23, regional = compile_for_generate's default), a fresh HOME +
# TORCHINDUCTOR_CACHE_DIR + TMPDIR (Inductor keeps its precompiled header under TMPDIR) per (mode,
# layers): the first run is cold, the second warm. Each run holds
# /tmp/timing.lock (timings never overlap) and waits for the machine to be quiet (QUIET, a command
# prefix; the runs record the CPU seconds other processes took meanwhile as others_cpu_s).
#   bash benchmarks/results/compile_first_tokens.sh [OUT.jsonl] ["whole regional"]
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$HERE/results/compile_first_tokens.jsonl}
MODES=${2:-whole regional}
: > "$OUT"
for L in 4 32; do
  [ -f /tmp/cold_ckpt_$L/model.safetensors ] || $PY "$HERE/bench_first_tokens.py" checkpoint $L /tmp/cold_ckpt_$L
  for mode in $MODES; do
    d=$(mktemp -d); mkdir -p $d/tmp
    for phase in cold warm; do
      line=$(cd /tmp && HOME=$d TMPDIR=$d/tmp TORCHINDUCTOR_CACHE_DIR=$d/ind flock /tmp/timing.lock $QUIET \
             $PY "$HERE/bench_first_tokens.py" $mode $L /tmp/cold_ckpt_$L 2>/dev/null | grep '^{')
      echo "{\"phase\": \"$phase\", \"r\": $line}" >> "$OUT"
      echo "$phase $mode $L: $line" | cut -c1-200
    done
    rm -rf "$d"
  done
done

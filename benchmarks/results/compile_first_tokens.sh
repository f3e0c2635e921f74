#!/bin/bash
# cold / warm first-generate table: whole vs regional, 4 and 32 layers, fresh HOME + TORCHINDUCTOR_CACHE_DIR per (mode, layers)
PY=${PYTHON:-python}
OUT=${1:-benchmarks/results/compile_first_tokens.jsonl}
: > $OUT
uptime >> $OUT.load
for order in "whole regional" ; do :; done
for L in 4 32; do
  for mode in $2; do
    d=$(mktemp -d)
    for phase in cold warm; do
      line=$(cd /tmp && HOME=$d TORCHINDUCTOR_CACHE_DIR=$d/ind $PY benchmarks/bench_first_tokens.py $mode $L /tmp/cold_ckpt_$L 2>/dev/null | grep '^{')
      echo "{\"phase\": \"$phase\", \"load_avg\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"r\": $line}" >> $OUT
      echo "$phase $mode $L: $line" | cut -c1-220
    done
    rm -rf $d
  done
done
uptime >> $OUT.load

#!/bin/bash
# usage: cft.sh OUT.jsonl  (regional, 4 and 32 layers, cold then warm, fresh HOME/TMPDIR/inductor cache)
OUT=$1; : > $OUT
for L in 4 32; do
  d=$(mktemp -d); mkdir -p $d/tmp
  for phase in cold warm; do
    line=$(cd /tmp && HOME=$d TMPDIR=$d/tmp TORCHINDUCTOR_CACHE_DIR=$d/ind flock /tmp/timing.lock /tmp/quiet.sh \
           /work/venv/bin/python /work/main/benchmarks/bench_first_tokens.py regional $L /tmp/cold_ckpt_$L 2>/dev/null | grep '^{')
    echo "{\"phase\": \"$phase\", \"r\": $line}" >> $OUT
    echo "$phase $L: $line" | cut -c1-150
  done
  rm -rf $d
done

#!/bin/bash
# Closed loop (48 in flight, 600 requests) on a fresh 1 encode + 1 combined cluster per run, alternating code versions.
# usage: satab.sh ROUNDS OUT DIR...
reps=$1; out=$2; shift 2
for r in $(seq 1 $reps); do
  for d in "$@"; do
    name=$(basename $d)
    (cd $d && PYTHONPATH=$d timeout 900 python -m benchmarks.bench --target local --request-rate inf --max-concurrency 48 \
      --num-requests 600 --output-tokens 32 --goodput ttft:2000 tpot:200 --seed $r --out $out/$name-$r --quiet > $out/$name-$r.log 2>&1)
    python3 -c "
import json; s=json.load(open('$out/$name-$r/bench.json'))['cells'][0]['summary']
print('$name $r', json.dumps({'goodput_rps': s['goodput_rps'], 'ttft_p50': s['ttft_ms']['p50'], 'tpot_p50': s['tpot_ms']['p50']}), flush=True)"
  done
done

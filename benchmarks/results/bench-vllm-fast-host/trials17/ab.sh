#!/bin/bash
# The alternation used for the ad-hoc A/Bs here: each code version (a git worktree, and the working tree) starts
# its own pinned 1 encode + 1 combined cluster per round and runs probe.py (60 unique 336 px JPEGs, 32 words,
# 32 output tokens, Poisson arrivals) at 1 then 4 req/s. usage: ab.sh ROUNDS OUT_PREFIX DIR_A DIR_B
reps=$1; out=$2; shift 2; probe=$(realpath "$(dirname "$0")/probe.py")
for r in $(seq 1 $reps); do
  for d in "$@"; do
    name=$(basename $d)
    (cd $d && PYTHONPATH=$d timeout 600 python "$probe" 1,4 60 1 adwc ${out}-${name}-$r.json 2>&1 | grep '^{' | sed "s/^/$name $r /")
  done
done

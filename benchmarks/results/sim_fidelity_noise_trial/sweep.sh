#!/bin/bash
# Re-simulate the four layouts' saved records (2026-12-03) for each host-noise setting, under the recorded SLOs.
# Run from the repository root; score.py reads what it writes.
mkdir -p /tmp/noise-trial
for s in 0 0.1 0.15 0.2 0.25 0.3; do for T in 20 50 100 200; do for lay in epd colocated_prefill adaptive stealing; do
  if [ $s = 0 ]; then noise=""; else noise="--host-noise-sigma $s --host-noise-period-ms $T"; fi
  timeout 300 .venv/bin/python -m benchmarks.sim_fidelity --resimulate benchmarks/results/sim_fidelity_layouts.at-6e6191d.$lay.json \
    $noise --out /tmp/noise-trial/sw-$lay-$s-$T.json > /dev/null 2>&1
done; done; done
echo done

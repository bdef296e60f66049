#!/bin/bash
# epd and colocated_prefill under SLOs tight enough for ~50 % live attainment at the middle rate, without and with
# the fitted host noise. Run from the repository root.
mkdir -p /tmp/noise-trial
for noise in "" "--host-noise-sigma 0.25 --host-noise-period-ms 50"; do
  for lay_slo in epd=0.045,0.0032 colocated_prefill=0.05,0.0045; do
    lay=${lay_slo%%=*}; tag=$( [ -z "$noise" ] && echo off || echo on )
    .venv/bin/python -m benchmarks.sim_fidelity --resimulate benchmarks/results/sim_fidelity_layouts.at-6e6191d.$lay.json \
      --slo $lay_slo $noise --out /tmp/noise-trial/tight-$lay-$tag.json > /dev/null 2>&1
    echo "$lay, host noise $tag (--slo $lay_slo $noise)"
    grep -E "^\| [0-9.]+ \| " /tmp/noise-trial/tight-$lay-$tag.md | cut -d'|' -f2-6
  done
done

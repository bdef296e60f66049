mkdir -p /tmp/noise-trial  # run from the repository root
for s in 0 0.1 0.15 0.2 0.25 0.3; do for T in 0.02 0.05 0.1 0.2; do for lay in epd colocated_prefill adaptive stealing; do
  HN_SIGMA=$s HN_PERIOD_S=$T PYTHONPATH=. timeout 300 .venv/bin/python benchmarks/results/sim_fidelity_noise_trial/host_noise_explore.py --resimulate benchmarks/results/sim_fidelity_layouts.at-6e6191d.$lay.json --out /tmp/noise-trial/sw-$lay-$s-$T.json > /dev/null 2>&1
done; done; done
echo done

"""python benchmarks/results/sim_fidelity_s26/judged_per_run_pair_share/perrun.py OUT_DIR records.json...: re-judge saved
records with colocated_prefill's compute_stretched read from each live run's own records (timer_stretch.run_stretch), the
other layouts at 0.175, printing colocated_prefill's errors at the runs' speed."""
import sys, json, contextlib, io
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import benchmarks.sim_fidelity_layouts as L
from benchmarks import sim_fidelity
from benchmarks.timer_stretch import run_stretch
orig_judge, orig_live = L.judge, L.live_compute
state = {}
def judge(report, *a):
    state['on'] = report['layout'] == 'colocated_prefill'
    return orig_judge(report, *a)
def live_compute(saved):
    L.COMPUTE_STRETCHED = run_stretch(saved)['seen'] if state.get('on') else 0.175
    print('share', L.COMPUTE_STRETCHED, file=sys.stderr)
    return orig_live(saved)
L.judge, L.live_compute = judge, live_compute
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
for f in sys.argv[2:]:
    dest = out / (Path(f).stem + '.json')
    with contextlib.redirect_stdout(io.StringIO()):
        sim_fidelity.main(['--resimulate', f, '--out', str(dest)])
    d = json.load(open(dest))
    for rep in d['layouts']:
        if rep['layout'] == 'colocated_prefill':
            for c in rep['cells']:
                e = c['error_run_speed']
                print(Path(f).stem, c['rate'], c['within_10pct_run_speed'], {k: round(v*100, 1) for k, v in e.items()}, flush=True)

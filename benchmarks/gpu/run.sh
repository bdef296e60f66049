#!/usr/bin/env bash
# The GPU measurement pack in one call (benchmarks/gpu/pack.py says what it measures): under 8 minutes on
# one GPU, JSON + markdown under benchmarks/results/gpu/.
#
#   benchmarks/gpu/run.sh                # measure everything
#   benchmarks/gpu/run.sh --check-only   # everything up to the first CUDA call (no GPU: exit 2 with the reason)
#
# The device host has torch, transformers and nvidia-ml-py but maybe not pydantic or pillow: wheels for
# Python 3.12 in $TIERSERVE_WHEELS (default build/gpu-wheels, an ignored path that travels with the call)
# are installed into a private folder when an import is missing. Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=${TIERSERVE_WHEELS:-build/gpu-wheels}
missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("pydantic", "PIL") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  if [ ! -d "$WHEELS" ]; then
    echo "benchmarks/gpu/run.sh: missing Python modules ($missing) and no wheels in $WHEELS" >&2
    exit 3
  fi
  SITE=${TMPDIR:-/tmp}/tierserve-pack-site
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$SITE" pydantic pillow
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" -m benchmarks.gpu.pack "$@"

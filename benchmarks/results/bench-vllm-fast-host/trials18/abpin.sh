#!/bin/bash
# probe_pin.py: ../trials17/probe.py with probe_pin.diff applied
# alternate: no pin vs stack pinned to core 0
for r in 1 2 3; do
  for mode in none 0; do
    if [ $mode = none ]; then env -u PIN_STACK X_FAST=1 timeout 600 .venv/bin/python probe_pin.py 1 60 1 adwc /tmp/s18/pin.json 2>&1 | grep -E '"rep"|marks' | sed "s/^/$mode $r /";
    else PIN_STACK=$mode X_FAST=1 timeout 600 .venv/bin/python probe_pin.py 1 60 1 adwc /tmp/s18/pin.json 2>&1 | grep -E '"rep"|marks' | sed "s/^/$mode $r /"; fi
  done
done
echo done

#!/bin/bash
# probe_pin.py: ../trials17/probe.py with probe_pin.diff applied
cd <worktree>
for r in 1 2 3; do
  for mode in base note; do
    if [ $mode = base ]; then X_FAST= timeout 600 .venv/bin/python probe_pin.py 1 60 1 adwc /tmp/s18/n.json 2>&1 | grep -E '"rep"|marks' | sed "s/^/$mode $r /";
    else X_NOTE=1 timeout 600 .venv/bin/python probe_pin.py 1 60 1 adwc /tmp/s18/n.json 2>&1 | grep -E '"rep"|marks' | sed "s/^/$mode $r /"; fi
  done
done
echo done

#!/bin/sh
# session 14, call 6: the first step in 128 MiB pieces with prefetch ramping up after a miss (the first
# training step at 4 GiB copied 251 GB for 34 GB used, 5.3 s: calls 3 and 5); then sampling's first step
# at 8 GiB in 64 MiB pieces (1.0 s against 0.32 s steady, call 2)
O=/tmp/w/o6 IMAGES=plain LATE=150 TO=70 . bench/gpu_call.sh
t tc4 arena-train --steps 3 --vram 4G --reserve 2560M --piece-size auto --image $W/f.arena
t a8 arena-sample --steps 4 --image $W/f.arena --vram 8G --reserve 1400M --piece-size auto
python3 - $O/tc4.jsonl $O/a8.jsonl <<'PY'
import json, sys
for p in sys.argv[1:]:
    try:
        d = json.loads(open(p).read())
    except Exception:
        continue
    r = d["records"]
    print(p.split("/")[-1], "first step %.3f s" % d["first_step_s"], "steps", [round(x, 3) for x in d["steps_s"]],
          "moved GB", [round(x["moved_bytes"] / 1e9, 1) for x in r], "misses", [x["misses"] for x in r],
          "stall_s", [round(x["stall_s"], 2) for x in r])
PY
log done
cd $O && tar czf $OUT/res.tgz .

#!/bin/sh
# session 13, call 4: training with the moves that must pay (defaults: learned, auto pieces) at 8 and 4 GiB
# against the resident step, and the host's side of the steps (thread CPU, steal) in 128 MiB pieces
O=/tmp/w/o4 IMAGES="plain hb4" LATE=480 TO=100 . bench/gpu_call.sh
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena --grads $W/grads-arena-train-c8.pt
t tc4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tp8b arena-train $TR --vram 8G --reserve 3G --piece-size 128M --no-learn --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/tc4.jsonl $O/tp8b.jsonl
python3 bench/torch_summary.py /dev/null $W
python3 - $O/tp8b.jsonl $O/tc8.jsonl <<'PY'
import json, sys
for p in sys.argv[1:]:
    d = json.loads(open(p).read())
    for i, h in enumerate(d.get("host_steps", [])):
        print(p.split("/")[-1], i, round(d["steps_s"][i], 4), d["phases_s"][i][0], {k: h.get(k) for k in ("fwd_host_s", "thread_cpu_s", "steal_s", "fwd_device_waiting")})
PY
log done
cd $O && tar czf $OUT/res.tgz .

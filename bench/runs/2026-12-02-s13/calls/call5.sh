#!/bin/sh
# session 13, call 5: the adapter's host time a block cut (parameter lists made once, one hook per input
# tensor in pieces): call 4's training runs again, host timing against call 4's
O=/tmp/w/o5 IMAGES="plain hb4" LATE=300 TO=90 . bench/gpu_call.sh
TR="--steps 12 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tp8b arena-train $TR --vram 8G --reserve 3G --piece-size 128M --no-learn --image $W/fc.arena --grads $W/grads-arena-train-p8.pt
t tc4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/tc4.jsonl $O/tp8b.jsonl
python3 bench/torch_summary.py /dev/null $W
python3 - $O/tr.jsonl $O/tc8.jsonl $O/tc4.jsonl $O/tp8b.jsonl <<'PY'
import json, sys, statistics as st
for p in sys.argv[1:]:
    try:
        d = json.loads(open(p).read())
    except Exception:
        continue
    hs = d.get("host_steps", [])[1:]
    f = [h["fwd_host_s"] for h in hs]
    print(p.split("/")[-1], "fwd host median %.3f (%.3f-%.3f)" % (st.median(f), min(f), max(f)), "fwd device median %.3f" % st.median(x[0] for x in d["phases_s"][1:]))
PY
log done
cd $O && tar czf $OUT/res.tgz .

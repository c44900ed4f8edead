#!/bin/sh
# session 15, call 1: (a) session 14's call 6, not run then: the first step in pieces with prefetch
# ramping up after a miss (training at 4 GiB in 128 MiB pieces; sampling at 8 GiB in 64 MiB pieces);
# (b) the disk tier spread through the schedule (arena_residency_host_split): sampling at 8 GiB with
# host budgets that keep peak RSS under streamed bytes + 1 GiB, against no budget, and session 14's
# whole-block 15G run (0.54-0.57 s steps with the tier at the schedule's end).
O=/tmp/w/o1 IMAGES=plain LATE=500 TO=90 . bench/gpu_call.sh
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
    print(p.split("/")[-1], "first step %.3f s" % d.get("first_step_s", -1), "steps", [round(x, 3) for x in d["steps_s"]],
          "moved GB", [round(x["moved_bytes"] / 1e9, 1) for x in r], "misses", [x["misses"] for x in r],
          "stall_s", [round(x["stall_s"], 2) for x in r])
PY
S="--steps 12 --vram 8G --reserve 1400M --piece-size auto --image $W/f.arena"
t s8 arena-sample $S
t h155 arena-sample $S --host-budget 15872M
t h14 arena-sample $S --host-budget 14G
t w15 arena-sample --steps 12 --vram 8G --reserve 1300M --image $W/f.arena --host-budget 15G
log done
cd $O && tar czf $OUT/res.tgz .

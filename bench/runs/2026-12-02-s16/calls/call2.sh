#!/bin/sh
# session 16, call 2: a quantized image in the adapter (4024255): flux-dev converted with
# --quant fp8-e4m3-row, each block's weights dequantized to bf16 when bound. Training (LoRA r16,
# AdamW, checkpointing every block) resident, at 8 and 4 GiB; sampling resident and at 8 GiB;
# against the bf16 (hb4 image, resident) runs of the same call. LoRA gradients of the first step:
# fp8 streamed against fp8 resident (equal?), and fp8 against bf16 (what the quantization changes).
O=/tmp/w/o2 IMAGES="hb4 fp8" LATE=500 TO=100 . bench/gpu_call.sh
TR="--steps 8 --gc-freeze"
t tr arena-train $TR --image $W/fc.arena --grads $W/g-bf16.pt
t trq arena-train $TR --image $W/fq.arena --grads $W/g-fq.pt
t tq8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fq.arena --grads $W/g-fq8.pt
t tq4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --keep-last 0 --image $W/fq.arena --grads $W/g-fq4.pt
python3 bench/train_bound.py $O/tr.jsonl $O/trq.jsonl $O/tq8.jsonl $O/tq4.jsonl
python3 - $W <<'PY'
import os, sys, torch
w = sys.argv[1]
ld = lambda n: torch.load(os.path.join(w, n)) if os.path.exists(os.path.join(w, n)) else None
ref, bf = ld("g-fq.pt"), ld("g-bf16.pt")
for n in ("g-fq8.pt", "g-fq4.pt"):
    g = ld(n)
    if g is None or ref is None:
        continue
    d = max((g[k].float() - ref[k].float()).abs().max().item() for k in ref)
    print(n, "against fp8 resident: largest difference %.3g, equal %s" % (d, all(torch.equal(g[k], ref[k]) for k in ref)))
if ref is not None and bf is not None:
    d = max((ref[k].float() - bf[k].float()).abs().max().item() for k in ref)
    big = max(bf[k].float().abs().max().item() for k in bf)
    print("fp8 resident against bf16 resident: largest difference %.3g (largest gradient %.3g)" % (d, big))
PY
S="--steps 12"
t sr arena-sample $S --image $W/fc.arena
t sq arena-sample $S --image $W/fq.arena
t sq8 arena-sample $S --vram 8G --reserve 1400M --piece-size auto --image $W/fq.arena
t sq4 arena-sample $S --vram 4G --reserve 1400M --piece-size auto --image $W/fq.arena
log done
cd $O && tar czf $OUT/res.tgz .

#!/bin/sh
# session 16, call 5 (the session's last device time): the dequantization kernel in runs of 16
# elements with a branch-free fp8 decode (call 3's: runs of 8, 0.45 of the device's copy rate):
# bit for bit against torch again, its rate; then #14's training step at 8 GiB and sampling at
# 8 GiB from the fp8-e4m3-row image against the bf16 resident steps of the same call.
# Results straight into $OUT.
mkdir -p /tmp/w; O=$OUT IMAGES="hb4 fp8" LATE=215 TO=70 . bench/gpu_call.sh
python3 - <<'PY'
import torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(5)
sd = {}
for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32)):
    for name, shape in (("a", (3072, 1024)), ("b", (7, 5)), ("c", (1000, 24))):
        x = torch.randn(*shape, generator=g) * torch.logspace(-6, 2, shape[-1])
        x.view(-1)[:6] = torch.tensor([0.0, -0.0, 1e-30, -448.0, 500.0, 3.0e-3])
        sd[f"blocks.{i}.{name}.weight"] = x.to(dt)
save_file(sd, "/tmp/w/dq.safetensors")
PY
DQ=
for s in fp8-e4m3-row fp8-e4m3-tensor fp8-e4m3 fp8-e5m2 int8-row bf16; do
	$A convert -q --quant $s /tmp/w/dq.safetensors -o /tmp/w/dq-$s.arena && DQ="$DQ /tmp/w/dq-$s.arena"
done
log dequant check
python3 bench/gpu_dequant_check.py $DQ $W/fq.arena | tee $O/dequant.jsonl | cut -c1-330
t tr arena-train --steps 6 --gc-freeze --image $W/fc.arena
t tq8 arena-train --steps 6 --gc-freeze --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fq.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tq8.jsonl
t sr arena-sample --steps 8 --image $W/fc.arena
t sq8 arena-sample --steps 8 --vram 8G --reserve 1400M --piece-size auto --image $W/fq.arena
t sq arena-sample --steps 8 --image $W/fq.arena
log done

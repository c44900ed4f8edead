#!/bin/sh
# session 16, call 3: arena_tensor_dequantize (one kernel a tensor) in the adapter: (a) bit for bit
# against torch on the GPU, every scheme from BF16, F16 and F32 sources and the flux-dev fp8 image,
# with its rate against a device copy; (b) call 2's runs again (training resident / 8 GiB / 4 GiB,
# sampling resident / 8 / 4 GiB, fp8-e4m3-row image) against the bf16 resident steps.
O=/tmp/w/o3 IMAGES="hb4 fp8" LATE=500 TO=100 . bench/gpu_call.sh
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
python3 bench/gpu_dequant_check.py $DQ $W/fq.arena | tee $O/dequant.jsonl | cut -c1-400
TR="--steps 8 --gc-freeze"
t tr arena-train $TR --image $W/fc.arena --grads $W/g-bf16.pt
t trq arena-train $TR --image $W/fq.arena --grads $W/g-fq.pt
t tq8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fq.arena --grads $W/g-fq8.pt
t tq4 arena-train $TR --vram 4G --reserve 2300M --offload-saved on --piece-size auto --keep-last 0 --image $W/fq.arena --grads $W/g-fq4.pt
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

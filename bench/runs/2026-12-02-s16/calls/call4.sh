#!/bin/sh
# session 16, call 4: call 3's fp8 LoRA gradients differed from the resident run's by 2.44e-4
# (call 2, torch's dequantization: 9.3e-10). Check every quantized weight as it is bound in a
# streamed training step (8 GiB whole blocks, 4 GiB pieces) against torch's dequantization, and
# two resident runs against each other (bench/gpu_quant_check.py).
mkdir -p /tmp/w; O=$OUT IMAGES=fp8 LATE=500 . bench/gpu_call.sh
log check
timeout 400 python3 bench/gpu_quant_check.py $W/fq.arena 2>$O/check.err | tee $O/check.jsonl || tail -5 $O/check.err
log done

#!/bin/sh
# gpu_quant_diag.sh - where a quantized convert spends its time on the GPU
# machine: wall, user, sys, page faults, context switches.
# usage: A=path/to/arena sh bench/gpu_quant_diag.sh SAFETENSORS WORKDIR
set -u
A=${A:-build/arena}
ST=$1
W=$2
fmt="%e s wall, %U user, %S sys, %R minor faults, %c invol. switches, %w waits"
cat "$ST" >/dev/null
for v in plain quant plain quant; do
	case $v in
	plain) args="" ;;
	quant) args="--quant fp8-e4m3-row" ;;
	esac
	# shellcheck disable=SC2086
	r=$(/usr/bin/time -f "$fmt" "$A" convert -q "$ST" -o "$W/x.arena" $args 2>&1 | tail -1)
	echo "$v: $r"
	rm -f "$W/x.arena"
	sync
done

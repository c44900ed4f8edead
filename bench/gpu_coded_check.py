"""Coded streaming on the GPU: the hb4 image loaded all resident equals the plain
one on the device, block for block; and every block of an hb4 image acquired through the
engine under a cap that streams most of them equals, byte for byte on the
device, the same block of the plain image all resident. Two steps, so blocks
come through the ring more than once (and the ring's slots are reused).

A check, not a timing: its reference is the plain image resident in the same
process. Prints the plan, the streamed and moved bytes a step and the count
of blocks that differ; exit status 1 when any does.

usage: python3 bench/gpu_coded_check.py PLAIN.arena CODED.arena [VRAM [PIECE]]
  (VRAM default 8G, PIECE 128M; env RESERVE, default 1G; ARENA_DEVICE, default
  cuda). PLAIN and CODED: the same checkpoint converted plain and with
  --codec hb4; a machine with an NVIDIA GPU, torch and the arena package."""

import sys

import torch

import arena_gpu as arena

plain, coded = sys.argv[1], sys.argv[2]
vram = sys.argv[3] if len(sys.argv) > 3 else "8G"
piece = sys.argv[4] if len(sys.argv) > 4 else "128M"
dev = __import__("os").environ.get("ARENA_DEVICE", "cuda")
ref = arena.open(plain, device=dev, piece_size=piece)
a = arena.open(coded, device=dev, vram=vram, piece_size=piece, reserve=__import__("os").environ.get("RESERVE", "1G"))
p = a.plan()
print("plan: %d streamed of %d blocks, host %.2f GiB" % (p["n_streamed"], len(a.blocks), p["host_bytes"] / 2**30))
assert len(a.blocks) == len(ref.blocks)
bad = 0
for step in range(2):
    a.step_begin()
    for b in range(len(a.blocks)):
        x = a.slab(b, a.acquire(b))
        r = ref.slab(b, ref.block_state(b)[1])
        if not torch.equal(x, r):
            bad += 1
            print("step %d block %s differs" % (step, a.blocks[b].name))
        a.release(b)
    a.step_end()
a.sync()
# the coded image loaded all resident (the loader's device decode) against the plain one
c = arena.open(coded, device=dev, piece_size=piece)
bad_load = sum(not torch.equal(c.slab(b, c.block_state(b)[1]), ref.slab(b, ref.block_state(b)[1])) for b in range(len(c.blocks)))
print("coded load, all resident: %d of %d blocks differ" % (bad_load, len(c.blocks)))
bad += bad_load
st = a.stats()
print("steps:", [(s["streamed_bytes"], s["moved_bytes"]) for s in st])
print("coded check: %d blocks x 2 steps, %d differ" % (len(a.blocks), bad))
sys.exit(1 if bad else 0)

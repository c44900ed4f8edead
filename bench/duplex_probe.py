"""duplex_probe.py - does a copy to the host slow the copies to the device?

Times 8 GiB of pinned host->device copies alone (the limit, measured first
and last in the same run), then with device->host copies of 1/8 and 1/2 as
many bytes running at the same time on another stream, as saved tensors
moved to host memory do in a training step (bench/RESULTS.md, "The PyTorch
adapter"). Prints one line a case: each direction's rate in GB/s.

usage: python3 bench/duplex_probe.py   (a machine with an NVIDIA GPU and torch)"""
import torch

dev = torch.device("cuda", 0)
chunk = 256 << 20
n = 32
h_src = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(4)]
d_dst = [torch.empty(chunk, dtype=torch.uint8, device=dev) for _ in range(4)]
d_src = torch.empty(chunk, dtype=torch.uint8, device=dev)
h_dst = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(4)]
up, down = torch.cuda.Stream(dev), torch.cuda.Stream(dev)


def run(n_down: int):
    torch.cuda.synchronize()
    s0, s1, d0, d1 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
    with torch.cuda.stream(up):
        s0.record()
        for i in range(n):
            d_dst[i % 4].copy_(h_src[i % 4], non_blocking=True)
        s1.record()
    with torch.cuda.stream(down):
        d0.record()
        for i in range(n_down):
            h_dst[i % 4].copy_(d_src, non_blocking=True)
        d1.record()
    torch.cuda.synchronize()
    t_up = s0.elapsed_time(s1) / 1e3
    t_down = d0.elapsed_time(d1) / 1e3 if n_down else 0.0
    return n * chunk / t_up / 1e9, (n_down * chunk / t_down / 1e9 if n_down else 0.0)


run(0)
for nd in (0, n // 8, n // 2, 0):
    u, d = run(nd)
    print(f"to device {u:.1f} GB/s alone" if not nd else f"to device {u:.1f} GB/s while {nd * chunk / 1e9:.1f} GB go to the host at {d:.1f} GB/s")

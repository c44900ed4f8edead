"""CUDA smoke test of arena.torch's saved-tensor offload (the CI tests run it on CPU tensors):
a checkpointed chain of layers, gradients with the offload against without, bit for bit."""
import torch
from torch.utils.checkpoint import checkpoint
import arena.torch as at

torch.manual_seed(0)
dev = torch.device("cuda", 0)
layers = [torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev, torch.bfloat16) for _ in range(12)]
x0 = torch.randn(8, 2048, 1024, device=dev, dtype=torch.bfloat16)


def run(off):
    for l in layers:
        l.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_(True)
    if off is not None:
        off.begin(True)
    h = x
    for l in layers:
        h = checkpoint(l, h.transpose(0, 1).contiguous().transpose(0, 1) if l is layers[3] else h, use_reentrant=False)
    if off is not None:
        off.end()
    h.float().square().mean().backward()
    return [p.grad.clone() for l in layers for p in l.parameters()] + [x.grad.clone()]


want = run(None)
torch.cuda.reset_peak_memory_stats()
off = at._SavedOffload(dev, 1 << 20)
for _ in range(3):
    got = run(off)
print("offload smoke:", off.stats(), "equal", all(torch.equal(a, b) for a, b in zip(want, got)),
      "peak %.1f MiB" % (torch.cuda.max_memory_allocated() / 2**20))
assert off.stats()["tensors"] > 0 and all(torch.equal(a, b) for a, b in zip(want, got)), "offload smoke failed"

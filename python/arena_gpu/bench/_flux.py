"""The model the benchmark runs and what every row's process shares.

diffusers' FluxTransformer2DModel at the FLUX.1-dev config (``arena synth
--layout flux-dev``), built on the meta device, 1024x1024 (4096 image + 512
text tokens), batch 1, bf16; or at the tiny config of ``arena synth --layout
flux-tiny`` (the simulated device's runs). Steps are timed on the device:
CUDA events on torch's stream, the host never waiting between steps (as a
sampling or training loop runs); on the simulator, where torch runs on the
CPU, by the host's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

FLUX_DEV: Dict[str, Any] = dict(
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)

# fixtures/tiny_flux.json's config, the layout `arena synth --layout flux-tiny` writes
FLUX_TINY: Dict[str, Any] = dict(
    in_channels=16,
    num_layers=2,
    num_single_layers=3,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=16,
    guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)


@dataclass(frozen=True)
class Layout:
    """A model the benchmark knows: its ``arena synth`` layout, config and inputs."""

    name: str
    config: Dict[str, Any]
    image_tokens: int
    text_tokens: int
    # the device memory a step takes beside the weights, for "does resident fit"
    sample_extra: int
    train_extra: int


LAYOUTS = {
    "flux-dev": Layout("flux-dev", FLUX_DEV, 4096, 512, 3 << 30, 9 << 29),
    "flux-tiny": Layout("flux-tiny", FLUX_TINY, 64, 16, 1 << 20, 1 << 20),
}

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


class Device:
    """Where torch runs a row: ``cuda`` (a GPU) or ``sim`` (torch on the CPU,
    arena's simulated device); its clock and its synchronization."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.cuda = backend == "cuda"
        self.torch_device = torch.device("cuda") if self.cuda else torch.device("cpu")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self) -> "Mark":
        m = Mark(self.cuda)
        m.record()
        return m


class Mark:
    """A point in the device's work: a CUDA event (timing enabled) on the current
    stream, or the host clock where torch runs on the CPU (synchronous)."""

    def __init__(self, cuda: bool) -> None:
        self.ev: Optional[torch.cuda.Event] = torch.cuda.Event(enable_timing=True) if cuda else None
        self.t = 0.0

    def record(self) -> None:
        if self.ev is not None:
            self.ev.record()
        else:
            self.t = time.perf_counter()

    def to(self, later: "Mark") -> float:
        """Seconds from this mark to ``later`` (both recorded and, on CUDA, complete)."""
        if self.ev is not None and later.ev is not None:
            return float(self.ev.elapsed_time(later.ev)) / 1e3
        return later.t - self.t


def meta_model(layout: Layout) -> torch.nn.Module:
    """The transformer on the meta device (nothing allocated), bf16, weights frozen."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        m: Any = FluxTransformer2DModel(**layout.config)
        m = m.to(torch.bfloat16)
    m.requires_grad_(False)
    mod: torch.nn.Module = m
    return mod


def inputs(layout: Layout, dev: Device, seed: int = 0) -> Dict[str, torch.Tensor]:
    """One batch: random latents and text states, bf16, on torch's device."""
    g = torch.Generator(device=dev.torch_device).manual_seed(seed)
    d, dt = dev.torch_device, torch.bfloat16
    c = layout.config
    T, Tt = layout.image_tokens, layout.text_tokens
    return dict(
        hidden_states=torch.randn(1, T, c["in_channels"], generator=g, device=d, dtype=dt),
        encoder_hidden_states=torch.randn(1, Tt, c["joint_attention_dim"], generator=g, device=d, dtype=dt),
        pooled_projections=torch.randn(1, c["pooled_projection_dim"], generator=g, device=d, dtype=dt),
        timestep=torch.tensor([0.5], device=d, dtype=dt),
        img_ids=torch.zeros(T, 3, device=d, dtype=dt),
        txt_ids=torch.zeros(Tt, 3, device=d, dtype=dt),
        guidance=torch.tensor([3.5], device=d, dtype=dt),
    )


def add_lora(m: torch.nn.Module, dev: Device) -> None:
    """LoRA rank 16 on the attention projections (peft), its weights bf16 on torch's
    device where the base layer is not on the meta device."""
    from peft import LoraConfig

    torch.manual_seed(1)
    m.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS,  # type: ignore[operator]
                             init_lora_weights="gaussian"))
    torch.manual_seed(2)
    for n, p in m.named_parameters():
        if "lora_" in n and p.device.type != "meta":
            p.data = p.data.to(device=dev.torch_device, dtype=torch.bfloat16)
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.01)


def link_rate(dev: Device, nbytes: int = 256 << 20, n: int = 5) -> float:
    """The pinned host-to-device copy rate now, bytes/s (the median of n copies of
    nbytes, timed by CUDA events): the limit a streamed step is held to."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rates = []
    for _ in range(n):
        a, b = dev.mark(), Mark(True)
        dst.copy_(src, non_blocking=True)
        b.record()
        dev.sync()
        rates.append(nbytes / max(a.to(b), 1e-9))
    del src, dst
    torch.cuda.empty_cache()
    return sorted(rates)[n // 2]


class TrainStep:
    """A LoRA training step (AdamW on the LoRA weights, gradient checkpointing on
    every block, the loss the output's mean square) with marks at the forward's and
    the backward's ends: the phases a training step's limit is made of."""

    def __init__(self, m: torch.nn.Module, x: Dict[str, torch.Tensor], dev: Device) -> None:
        self.m, self.x, self.dev = m, x, dev
        self.params = [p for p in m.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        self.marks: List[List[Mark]] = []  # per step: forward end, backward end

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.m(**self.x).sample.float().square().mean()
        f = self.dev.mark()
        loss.backward()
        b = self.dev.mark()
        self.opt.step()
        self.marks.append([f, b])


def time_steps(step: Callable[[], None], n: int, dev: Device, after: Optional[Callable[[], None]] = None) -> List[Mark]:
    """Run n steps with a mark between each two (the host never waits in between
    on CUDA); ``after`` runs after each step (on the host). Returns the n + 1
    marks, complete."""
    dev.sync()
    marks = [dev.mark()]
    for _ in range(n):
        step()
        marks.append(dev.mark())
        if after is not None:
            after()
    dev.sync()
    return marks


def median(v: List[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2] if s else float("nan")

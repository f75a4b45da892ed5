"""The public model set (docs/benchmarks.md's model suite): real models no one here wrote,
with random weights and inputs, each as an inference step and a training step.

A `ModelCase` makes its module and inputs on a device and says how to run one step on
them; the loss of a training step is `out.float().sin().mean()` (a loss of squares after a
final norm is invariant and its gradients are noise). Hugging Face
`transformers` and `timm` are imported only by the cases that need them. The suite's
default set: gpt2, resnet18, gpt_block_train, `vit_b16` (timm ViT-B/16, b32 at 224 px) and
`convnext_tiny` (timm ConvNeXt-T, b32 at 224 px: depthwise 7x7 convolutions, LayerNorm over
channels, an MLP on channels-last activations; another architecture family).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BF16 = torch.bfloat16


@dataclass(frozen=True)
class ModelCase:
    """One model of the set: `make(device, small)` -> (module, inputs); `forward(module,
    inputs)` -> the output tensor a loss is taken of."""

    name: str
    make: Callable[[torch.device, bool], tuple[nn.Module, list[torch.Tensor]]]
    forward: Callable[[nn.Module, list[torch.Tensor]], torch.Tensor]


def _gpt2(device: torch.device, small: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    layers, d, heads, batch, seq = (1, 64, 2, 1, 16) if small else (6, 768, 12, 8, 512)
    config = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=1024,
                        vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2Model(config).to(device, BF16)
    return model, [torch.randint(0, config.vocab_size, (batch, seq), device=device)]


def _resnet18(device: torch.device, small: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    import timm

    batch, px = (2, 32) if small else (32, 224)
    model = timm.create_model("resnet18", pretrained=False).to(device, BF16)
    return model, [torch.randn(batch, 3, px, px, device=device, dtype=BF16)]


def _vit(device: torch.device, small: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    import timm

    name, batch, px = (("vit_tiny_patch16_224", 2, 32) if small
                       else ("vit_base_patch16_224", 32, 224))
    model = timm.create_model(name, pretrained=False, img_size=px).to(device, BF16)
    return model, [torch.randn(batch, 3, px, px, device=device, dtype=BF16)]


def _convnext(device: torch.device, small: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    import timm

    name, batch, px = ("convnext_atto", 2, 32) if small else ("convnext_tiny", 32, 224)
    model = timm.create_model(name, pretrained=False).to(device, BF16)
    return model, [torch.randn(batch, 3, px, px, device=device, dtype=BF16)]


def _gpt_block(device: torch.device, small: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    from bench.cases import case

    return case("gpt_block_train", scale="tiny" if small else "full").make(device)


MODELS: dict[str, ModelCase] = {
    "gpt2": ModelCase("gpt2", _gpt2,
                      lambda m, xs: m(input_ids=xs[0], use_cache=False).last_hidden_state),
    "resnet18": ModelCase("resnet18", _resnet18, lambda m, xs: m(*xs)),
    "vit_b16": ModelCase("vit_b16", _vit, lambda m, xs: m(*xs)),
    "convnext_tiny": ModelCase("convnext_tiny", _convnext, lambda m, xs: m(*xs)),
    "gpt_block_train": ModelCase("gpt_block_train", _gpt_block, lambda m, xs: m(*xs)),
}
STEPS = ("infer", "train")


# The packages a model of the set is made with, beyond torch (none: the model is this project's).
NEEDS = {"gpt2": "transformers", "resnet18": "timm", "vit_b16": "timm", "convnext_tiny": "timm"}


def missing_package(model: str) -> str | None:
    """The package `model` is made with when this Python cannot import it, else None: the
    benchmarks name it before starting processes that would each fail on the import."""
    import importlib.util

    package = NEEDS.get(model)
    return package if package and importlib.util.find_spec(package) is None else None


def instantiate(model: str, device: torch.device, small: bool
                ) -> tuple[ModelCase, nn.Module, list[torch.Tensor]]:
    """A case of the set with its module and inputs, seeded (every process draws the same)."""
    case = MODELS[model]
    torch.manual_seed(0)
    module, inputs = case.make(device, small)
    return case, module, inputs


class CaseStep(nn.Module):
    """A case's forward over its module as a module of its own, returning the tensor a loss
    is taken of (not a `ModelOutput`): what AOTAutograd traces for the case."""

    def __init__(self, case: ModelCase, module: nn.Module) -> None:
        super().__init__()
        self.case, self.module = case, module

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.case.forward(self.module, list(inputs))


def loss_of(out: torch.Tensor) -> torch.Tensor:
    """The model suite's training loss (docs/benchmarks.md)."""
    return out.float().sin().mean()


def step_fn(case: ModelCase, step: str, module: nn.Module, inputs: list[torch.Tensor]
            ) -> Callable[[], Any]:
    """One step as a closure: inference (eval mode, no grad) or a training step (train mode;
    zero grads, forward, loss, backward). Returns what the step computed (output or loss)."""
    if step == "infer":
        module.eval()

        def infer() -> torch.Tensor:
            with torch.no_grad():
                return case.forward(module, inputs)
        return infer
    module.train()

    def train() -> torch.Tensor:
        for p in module.parameters():
            p.grad = None
        loss = loss_of(case.forward(module, inputs))
        loss.backward()
        return loss.detach()
    return train


def compiled(path: str, module: nn.Module) -> nn.Module:
    """`module` as a benchmark path runs it: `eager` as it is, `inductor_ro` through
    `torch.compile(mode="reduce-overhead")` (CUDA graphs), `inductor_ma` through
    `mode="max-autotune"`, other `inductor...` paths through
    `torch.compile`'s default, `kiln...` through `backend="kiln"` (`kiln.remote_compile`)."""
    if path == "eager":
        return module
    if path == "inductor_ro":
        return torch.compile(module, mode="reduce-overhead")
    if path == "inductor_ma":
        return torch.compile(module, mode="max-autotune")
    if path.startswith("inductor"):
        return torch.compile(module)
    import kiln

    return torch.compile(module, backend=kiln.remote_compile)


def add_case_arguments(parser: Any) -> None:
    """The arguments naming one case of the set (model, step) and how to run it: the
    internal per-case subcommands of bench/flow.py and bench/model_suite.py share them."""
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--step", required=True, choices=STEPS)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--iters", type=int, default=20)

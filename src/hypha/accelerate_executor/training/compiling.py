"""torch.compile for the step's model, where it pays, without changing what the network sees.

`HYPHA_COMPILE` (`--compile`): `on`, `off`, or `auto` (the default), which compiles on a
CUDA GPU whose Triton and C compiler are there, and nowhere else:
- CPU: measured not to pay on the jobs this executor trains here (bench/compile_step.py,
  docs/performance.md), and inductor's C++ backend needs a compiler the cpu image lacks.
- ROCm: torch's "cuda" device too, but unmeasured here: off until a ROCm run shows it pays.
- MPS: inductor's Metal backend is still a prototype in torch 2.13: off.
- DeepSpeed: its engine's ZeRO hooks are not measured compiled: off (FSDP2 and DDP compile).
- Tensor parallelism (distributed type "TP" here): its DTensor layers are not measured
  compiled: off; `on` compiles them, and falls back to eager where that fails.

What is compiled: each block of the model's transformer block list, in place
(`Module.compile`, which keeps the module and its parameters as they are: no `_orig_mod.`
in any state dict, tied weights still tied), so one block's graph serves every block and the
compile time does not grow with the depth; and the output projection (`get_output_embeddings`),
whose vocabulary-wide products eager cuBLAS runs on a slow kernel when the vocabulary is not a
multiple of 8 (GPT-2's 50,257): inductor pads them inside the graph (its pad_mm pass), so the
weights keep their shape. A model without a block list is compiled whole, in place too. The loss, the optimizer step and the micro-batching stay as they are. The
shapes are dynamic from the start (`dynamic=True`), so the round's last, shorter batch and a
shorter last micro-batch reuse the graph rather than compiling another one.

Compiling is lazy: it happens in the first forward. `Compiled.fall_back` undoes it when that
fails (no C compiler, an operator inductor cannot lower), and the step runs eager from then
on, after one line: a compile failure never fails the job.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Inductor builds each kernel with the host's C compiler; Triton builds its launcher with it too.
C_COMPILERS = ("cc", "gcc", "clang")


def compiler_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot build kernels for `device` here; None when it can."""
    if not any(shutil.which(name) for name in C_COMPILERS):
        return "no C compiler (cc, gcc or clang) on PATH"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "no Triton"
    return None


def auto_compiles(device: torch.device, distributed_type: str = "NO") -> tuple[bool, str]:
    """`auto`'s choice for `device` under accelerate's `distributed_type`, and why (the
    module's docstring says how it was decided)."""
    if distributed_type == "DEEPSPEED":
        return False, "auto: not under DeepSpeed (its ZeRO hooks are not measured compiled)"
    if distributed_type == "TP":
        return False, "auto: not under tensor parallelism (not measured compiled)"
    if device.type != "cuda":
        return False, f"auto: not on {device.type} (measured not to pay)"
    if torch.version.hip is not None:
        return False, "auto: not on ROCm (not measured)"
    missing = compiler_missing(device)
    if missing is not None:
        return False, f"auto: {missing}"
    return True, "auto: a CUDA GPU with Triton and a C compiler"


def block_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's transformer blocks: the largest ModuleList of two or more modules of one
    class (GPT-2's transformer.h, Llama's model.layers, BERT's encoder.layer)."""
    found = None
    for module in model.modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) >= 2
            and len({type(block) for block in module}) == 1
            and (found is None or len(module) > len(found))
        ):
            found = module
    return found


def output_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output projection (a transformers model's `get_output_embeddings()`), where
    it is a plain Linear layer."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if type(head) is torch.nn.Linear else None


@dataclass
class Compiled:
    """The modules compiled in place, and what was said about it."""

    modules: list[torch.nn.Module] = field(default_factory=list)
    what: str = "eager"

    @property
    def active(self) -> bool:
        return bool(self.modules)

    def fall_back(self, exc: BaseException, say: Callable[[str], None]) -> None:
        """Back to eager for good, after one line naming the failure."""
        for module in self.modules:
            module._compiled_call_impl = None  # what Module.compile set
        self.modules = []
        self.what = "eager"
        detail = " ".join(str(exc).split())[:300]
        say(f"compile failed, running eager: {type(exc).__name__}: {detail}")


def compile_model(
    model: torch.nn.Module, choice: str, device: torch.device, distributed_type: str = "NO"
) -> Compiled:
    """Compiles `model` in place as `choice` (on, off, auto) asks, for `device` under
    accelerate's `distributed_type`; returns what it did."""
    if choice == "off":
        return Compiled(what="eager (off)")
    if choice == "auto":
        chosen, why = auto_compiles(device, distributed_type)
        if not chosen:
            return Compiled(what=f"eager ({why})")
    else:
        why = "on"
    blocks = block_list(model)
    if blocks is None:
        model.compile(dynamic=True)
        return Compiled([model], f"compiled ({why}): the whole model")
    modules: list[torch.nn.Module] = list(blocks)
    where = f"{len(blocks)} {type(blocks[0]).__name__} blocks"
    head = output_head(model)
    if head is not None:
        modules.append(head)
        where += " and the output projection"
    for module in modules:
        module.compile(dynamic=True)
    return Compiled(modules, f"compiled ({why}): {where}")


def is_compile_failure(exc: BaseException) -> bool:
    """An error of dynamo or inductor, as opposed to one of the model's own."""
    from torch._dynamo.exc import TorchDynamoException

    if isinstance(exc, TorchDynamoException):
        return True
    return type(exc).__module__.startswith(("torch._inductor", "torch._dynamo", "triton"))

"""What each way of compiling a training step buys on the GPU, against the eager step in the
same run: the selftest's GPT-2 (default 124M, bf16 autocast, batch 16 x 1024, the executor's
fused AdamW), one process, the bare step (no bridge, no executor).

    python bench/gpu_acceptance/compile_variants.py [--model gpt2-124m] [--steps 10]

(`--device cpu --model tiny` is the local dry run: figures that say nothing about a GPU.)

Variants, each on a fresh model from the same seed:
  eager         the step as upstream's executor runs it: the baseline
  blocks        each transformer block compiled in place (what the executor did first)
  blocks+head   the blocks and the output projection: inductor pads the projection's
                50,257 columns inside the graph, where cuBLAS otherwise falls back to a slow
                kernel; the weights keep their shape
  whole         the whole model, its loss included, compiled in one graph
  liger         the blocks compiled, the output projection and the cross-entropy as Liger's
                fused kernel (never materialises the logits); only where liger-kernel imports
For each: the step's median wall time, tokens/s, the ratio to eager, the first step's time
(compiling), peak memory, the loss after the timed steps (the same data and seed for every
variant, so the losses should agree within bf16 noise), and how many graphs a shorter batch
(the round's last) compiled beyond the first (0: dynamic shapes took it).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._dynamo

from hypha.accelerate_executor.training.compiling import block_list, output_head
from hypha.accelerate_executor.training.optimization import build_adamw
from hypha.selftest.workload import SIZES, SelftestSpec
from hypha.standin.data_service.assets import build_model


@dataclass
class Outcome:
    name: str
    step_s: float
    first_s: float
    peak_bytes: int
    loss: float
    recompiled: int | str


def graphs_compiled() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def liger_loss(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The step's loss through Liger's fused linear cross-entropy, or None without Liger."""
    try:  # an optional wheel of the GPU run's (prepare.sh), not a dependency: no stubs
        liger = importlib.import_module("liger_kernel.transformers")
    except ImportError:
        return None
    fused = liger.LigerFusedLinearCrossEntropyLoss()
    head = output_head(model)
    assert head is not None

    def loss(tokens: torch.Tensor) -> torch.Tensor:
        hidden = model.transformer(input_ids=tokens).last_hidden_state  # type: ignore[operator]
        width = hidden.shape[-1]
        return fused(head.weight, hidden[:, :-1].reshape(-1, width), tokens[:, 1:].reshape(-1))

    return loss


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(name: str, model_name: str, steps: int, device: torch.device) -> Outcome | None:
    size = SIZES[model_name]
    torch.manual_seed(0)
    model = build_model(SelftestSpec.of(size))
    torch.nn.Module.to(model, device)
    model.train()
    if name in ("blocks", "blocks+head", "liger"):
        blocks = block_list(model)
        assert blocks is not None
        for block in blocks:
            block.compile(dynamic=True)
    if name == "blocks+head":
        head = output_head(model)
        assert head is not None
        head.compile(dynamic=True)
    if name == "whole":
        model.compile(dynamic=True)
    fused = liger_loss(model) if name == "liger" else None
    if name == "liger" and fused is None:
        return None
    optimizer = build_adamw(model.parameters(), {"lr": 1e-4}, device)
    generator = torch.Generator(device="cpu").manual_seed(1)
    batches = [
        torch.randint(size.vocab_size, (size.batch_size, size.seq_len), generator=generator)
        for _ in range(steps + 2)
    ]

    def step(tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(device, non_blocking=True)
        with torch.autocast(device.type, torch.bfloat16):
            loss = fused(tokens) if fused else model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    step(batches[0])
    synchronize(device)
    first = time.perf_counter() - started
    step(batches[1])
    times = []
    loss = torch.zeros(())
    for tokens in batches[2:]:
        synchronize(device)
        started = time.perf_counter()
        loss = step(tokens)
        synchronize(device)
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    before = graphs_compiled()
    step(batches[0][: size.batch_size - 5])  # the round's last, shorter batch
    synchronize(device)
    recompiled: int | str = graphs_compiled() - before if name != "eager" else "-"
    outcome = Outcome(name, statistics.median(times), first, peak, float(loss), recompiled)
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2-124m", choices=tuple(SIZES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--variants", default="eager,blocks,blocks+head,whole,liger", help="comma-separated"
    )
    args = parser.parse_args()
    size = SIZES[args.model]
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else args.device
    print(
        f"{args.model}: batch {size.batch_size} x {size.seq_len}, bf16 autocast, {where}, "
        f"torch {torch.__version__}"
    )
    print(
        f"{'variant':<12} {'ms/step':>8} {'tokens/s':>10} {'x eager':>8} {'first s':>8} "
        f"{'peak GiB':>9} {'loss':>8} {'recompiled':>10}"
    )
    eager: float | None = None
    for name in args.variants.split(","):
        outcome = run(name, args.model, args.steps, device)
        if outcome is None:
            print(f"{name:<12} skipped: liger-kernel does not import")
            continue
        eager = eager or (outcome.step_s if name == "eager" else None)
        ratio = f"{eager / outcome.step_s:.3f}" if eager else "-"
        print(
            f"{name:<12} {1e3 * outcome.step_s:>8.1f} "
            f"{size.tokens_per_step / outcome.step_s:>10,.0f} {ratio:>8} "
            f"{outcome.first_s:>8.1f} {outcome.peak_bytes / (1 << 30):>9.2f} "
            f"{outcome.loss:>8.4f} {outcome.recompiled!s:>10}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Where a training step's time goes on the GPU: the selftest's GPT-2 (default 124M, bf16
autocast, batch 16 x 1024, the executor's fused AdamW) for a few steps under torch's
profiler; prints the step's wall time, the attention implementation, and the operators
that took the most GPU time.

    python bench/gpu_acceptance/profile_step.py [--model gpt2-124m] [--steps 5]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from hypha.accelerate_executor.training.optimization import build_adamw
from hypha.selftest.workload import SIZES, SelftestSpec
from hypha.standin.data_service.assets import build_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2-124m", choices=tuple(SIZES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--vocab", type=int, help="another vocabulary size (50304: a multiple of 64)"
    )
    parser.add_argument(
        "--activation", help="another GPT-2 activation (gelu_pytorch_tanh: one kernel)"
    )
    parser.add_argument("--no-table", action="store_true", help="the step time only")
    args = parser.parse_args()
    size = SIZES[args.model]
    if args.vocab:
        size = replace(size, vocab_size=args.vocab)
    device = torch.device("cuda", 0)
    model = build_model(SelftestSpec.of(size))
    if args.activation:
        model.config.activation_function = args.activation
        model = type(model)(model.config)
    torch.nn.Module.to(model, device)  # in place; transformers wraps `to` beyond mypy
    model.train()
    optimizer = build_adamw(model.parameters(), {"lr": 1e-4}, device)
    tokens = torch.randint(size.vocab_size, (size.batch_size, size.seq_len), device=device)

    def step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) / args.steps
    print(
        f"{args.model} (vocab {size.vocab_size}, {model.config.activation_function}): "
        f"{1e3 * wall:.1f} ms a step, attention {model.config._attn_implementation}"
    )
    if args.no_table:
        return
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
    )


if __name__ == "__main__":
    main()

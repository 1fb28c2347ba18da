"""The executor's step with HYPHA_GRADIENT_CHECKPOINTING against the same step keeping its
activations: the peak memory each needs, and what the recompute costs in step time.

    python bench/activation_checkpointing.py [--layers N] [--hidden N] [--batch N]
                                             [--sequence N] [--steps N] [--repeats N]
                                             [--smoke] [--json PATH]

Both sides are the executor's own MicroBatchedStep (forward, backward, fused AdamW) over the same
Llama (transformers' LlamaConfig, random init from one seed: about 50M parameters by default,
untied embeddings) on the same batch of random tokens; the checkpointed side's model went through
`modeling.checkpoint_activations`, as the executor's does with the setting on. Each side runs in
a process of its own, so that its peak is its own: the peak resident set (VmHWM) on the CPU,
torch's max-allocated on a CUDA GPU. Beside it, what the process held before its first step
(the weights and the process itself): the peak above it is the step's own memory, the
gradients, AdamW's state and the activations, of which only the activations differ between the
two sides. (Held after a step is no measure on the CPU: the allocator keeps freed activations'
pages.) Step time is the median of `--steps` steps after one warm-up step (which allocates
AdamW's state); with `--repeats` the sides' processes take turns, and each side's figures are
the median over its processes. The ratios are checkpointed over kept: below 1 for memory is what it saves,
above 1 for time what it costs; the losses of the two sides are compared too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

VOCABULARY = 8192


def resident_set(field: str) -> int:
    """This process's VmHWM (peak) or VmRSS (now) in bytes, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def one_case(arguments: argparse.Namespace) -> dict[str, Any]:
    """In the child process: build, step, measure."""
    import torch
    import transformers
    from accelerate import Accelerator

    from hypha.accelerate_executor.training.distributed import Ranks
    from hypha.accelerate_executor.training.modeling import checkpoint_activations
    from hypha.accelerate_executor.training.optimization import build_adamw
    from hypha.accelerate_executor.training.steps import MicroBatchedStep

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCABULARY, hidden_size=arguments.hidden, intermediate_size=arguments.hidden * 8 // 3,
        num_hidden_layers=arguments.layers, num_attention_heads=arguments.hidden // 64 or 1,
        max_position_embeddings=arguments.sequence, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    checkpoint_activations(model, asked=arguments.case == "checkpointed", by_fsdp=False)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    optimizer = build_adamw(model.parameters(), {"lr": 1e-4}, accelerator.device, False)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    step = MicroBatchedStep(
        accelerator, model, optimizer, Ranks(accelerator), arguments.batch, ["input_ids"],
        None, lambda line: print(line, file=sys.stderr),
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(
        0, VOCABULARY, (arguments.batch, arguments.sequence), generator=generator
    )
    batch = {"input_ids": tokens.to(accelerator.device), "labels": tokens.to(accelerator.device)}
    on_gpu = accelerator.device.type == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    before = int(torch.cuda.memory_allocated()) if on_gpu else resident_set("VmRSS")
    losses, seconds = [], []
    for _ in range(arguments.steps + 1):
        synchronize()
        started = time.perf_counter()
        losses.append(float(step(batch)))
        synchronize()
        seconds.append(time.perf_counter() - started)
    return {
        "case": arguments.case,
        "device": str(accelerator.device),
        "threads": torch.get_num_threads(),
        "parameters": parameters,
        "peak_bytes": (int(torch.cuda.max_memory_allocated()) if on_gpu else resident_set("VmHWM")),
        "before_steps_bytes": before,
        "step_s": statistics.median(seconds[1:]),
        "losses": losses,
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures, each the median over its processes (the losses: the first's)."""
    figures = ("peak_bytes", "before_steps_bytes", "step_s")
    return {**runs[0], **{name: statistics.median(run[name] for run in runs) for name in figures}}


def measured(
    case: str, argv: list[str], env: dict[str, str] | None = None, label: str = ""
) -> dict[str, Any]:
    """One process of this script's `case` on the step shape `argv`, in `env` (default this
    process's environment); `label` names it if it fails (default: the case)."""
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--case", case],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{label or f'the {case} case'} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def step_parser(description: str, steps: int, repeats: int) -> argparse.ArgumentParser:
    """The step's shape, its repeats, --smoke and --json: this bench's and
    bench/host_allocator.py's arguments."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=512)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--repeats", type=int, default=repeats, help="processes a side, in turns")
    parser.add_argument(
        "--smoke", action="store_true", help="2 layers of 64, 2 x 32 tokens, 1 step"
    )
    parser.add_argument("--json", type=Path)
    return parser


def step_shape(arguments: argparse.Namespace) -> list[str]:
    """The child's arguments for the parsed shape, --smoke's tiny one where asked."""
    if arguments.smoke:
        arguments.layers, arguments.hidden, arguments.batch = 2, 64, 2
        arguments.sequence, arguments.steps, arguments.repeats = 32, 1, 1
    return [
        f"--layers={arguments.layers}", f"--hidden={arguments.hidden}", f"--batch={arguments.batch}",
        f"--sequence={arguments.sequence}", f"--steps={arguments.steps}",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = step_parser(__doc__.split("\n\n")[0], steps=3, repeats=1)
    parser.add_argument("--case", choices=("kept", "checkpointed"), help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    shape = step_shape(arguments)
    if arguments.case:  # the child
        print(json.dumps(one_case(arguments)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"kept": [], "checkpointed": []}
    for _ in range(arguments.repeats):
        for case, processes in runs.items():
            processes.append(measured(case, shape))
    kept, checkpointed = median_of(runs["kept"]), median_of(runs["checkpointed"])
    loss_gap = max(abs(a - b) for a, b in zip(kept["losses"], checkpointed["losses"], strict=True))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": kept["device"],
        "threads": kept["threads"],
        "parameters": kept["parameters"],
        "layers": arguments.layers,
        "hidden": arguments.hidden,
        "batch": arguments.batch,
        "sequence": arguments.sequence,
        "steps": arguments.steps,
        "repeats": arguments.repeats,
        "kept": kept,
        "checkpointed": checkpointed,
        "peak_ratio": checkpointed["peak_bytes"] / kept["peak_bytes"],
        "step_memory_ratio": (checkpointed["peak_bytes"] - checkpointed["before_steps_bytes"])
        / max(kept["peak_bytes"] - kept["before_steps_bytes"], 1),
        "saved_bytes": kept["peak_bytes"] - checkpointed["peak_bytes"],
        "step_time_ratio": checkpointed["step_s"] / kept["step_s"],
        "largest_loss_difference": loss_gap,
    }
    what = "max-allocated" if kept["device"].startswith("cuda") else "peak RSS"
    print(
        f"activation checkpointing, {kept['parameters'] / 1e6:.1f}M-parameter Llama "
        f"({arguments.layers} layers of {arguments.hidden}), batch {arguments.batch}x"
        f"{arguments.sequence} on {kept['device']} ({kept['threads']} threads):"
    )
    for side in (kept, checkpointed):
        print(
            f"  {side['case']:>12}: {what} {side['peak_bytes'] / 1e9:.2f} GB "
            f"({(side['peak_bytes'] - side['before_steps_bytes']) / 1e9:.2f} GB above the "
            f"{side['before_steps_bytes'] / 1e9:.2f} GB before the first step), step "
            f"{side['step_s']:.2f} s (median of {arguments.steps} x {arguments.repeats})"
        )
    print(
        f"  ratio checkpointed/kept: peak {result['peak_ratio']:.3f} "
        f"({result['saved_bytes'] / 1e9:.2f} GB saved), the step's own memory "
        f"{result['step_memory_ratio']:.3f}, step time {result['step_time_ratio']:.3f}; "
        f"losses differ by at most {loss_gap:.1e}"
    )
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

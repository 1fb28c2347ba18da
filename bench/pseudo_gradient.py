"""Benchmark 4: pseudo-gradients in fp32 (the default) against bf16.

The local demo runs twice, the same way but for `--pseudo-gradient-dtype`. Reported per
dtype: the bytes a worker sends per round, and the demo's first and final mean loss.
The bytes are the size of the file the executor's own writer makes for the demo model;
the executor's round lines of the run itself must agree (to their 0.1 MB rounding),
which also proves the flag reached the executors.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from accelerate import Accelerator

from bench.errors import BenchError
from bench.models import DEMO
from hypha.accelerate_executor.training.diloco import GlobalWeights
from hypha.accelerate_executor.training.distributed import ModelWeights, canonical_names
from hypha.standin.coordinator.server import RunOptions
from hypha.standin.demo import run_demo
from hypha.standin.worker.executor_entries import ExecutorEntry, preset

DTYPES = ("float32", "bfloat16")
ROUND_LINE = re.compile(r"round \d+: loss .*\(([\d.]+) MB out\)")


@dataclass
class DtypeRun:
    dtype: str
    bytes_per_round: int
    sent_mb_per_round: list[float]  # as the executors' round lines report it
    first_loss: float
    final_loss: float


class Transcript(io.StringIO):
    """Keeps what is written and passes it on to `echo`."""

    def __init__(self, echo: TextIO) -> None:
        super().__init__()
        self._echo = echo

    def write(self, text: str) -> int:
        self._echo.write(text)
        return super().write(text)


def pseudo_gradient_bytes(dtype: str) -> int:
    """The size of one round's pseudo-gradient file for the demo model."""
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(DEMO.build())
    weights = ModelWeights(accelerator, model, canonical_names(model))
    with tempfile.TemporaryDirectory() as folder:
        return GlobalWeights(weights.local()).write_pseudo_gradient(
            weights.local(), Path(folder) / "pseudo-gradient", getattr(torch, dtype)
        )


def demo_run(dtype: str, options: RunOptions, out_dir: Path, work_base: Path) -> DtypeRun:
    base = preset("process")
    executor = ExecutorEntry(base.cmd, (*base.args, "--pseudo-gradient-dtype", dtype))
    transcript = Transcript(sys.stderr)
    with contextlib.redirect_stdout(transcript):
        run_demo(options, executor, out_dir=out_dir, work_base=work_base, timeout_s=1800.0)
    # The demo's verdict (did the loss fall far enough) is not this benchmark's question;
    # executors that failed are.
    summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    failed = {name: w["exit_code"] for name, w in summary["workers"].items() if w["exit_code"] != 0}
    if failed or len(summary["workers"]) != options.workers:
        raise BenchError(f"the {dtype} demo run failed: executor exit codes {failed or 'missing'}")
    if summary["final_mean_loss"] is None:
        raise BenchError(f"the {dtype} demo run reported fewer than 2 rounds of loss")
    expected = pseudo_gradient_bytes(dtype)
    sent = [float(mb) for mb in ROUND_LINE.findall(transcript.getvalue())]
    if not sent or any(abs(mb * 1e6 - expected) > 0.051e6 for mb in sent):
        raise BenchError(
            f"the {dtype} executors reported sending {sorted(set(sent))} MB per round, "
            f"expected {expected / 1e6:.1f} MB"
        )
    return DtypeRun(
        dtype,
        expected,
        sent,
        float(summary["first_mean_loss"]),
        float(summary["final_mean_loss"]),
    )


def run(out_root: Path, work_base: Path, options: RunOptions) -> list[DtypeRun]:
    return [demo_run(dtype, options, out_root / f"demo-{dtype}", work_base) for dtype in DTYPES]

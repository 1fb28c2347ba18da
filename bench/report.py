"""The results as rows of claims: a table on stdout, a JSON file and a PNG plot."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench.data_path import DataPathResult
from bench.inner_loop import InnerLoopResult
from bench.pseudo_gradient import DtypeRun
from bench.rounds import BASELINE, EXECUTOR, RoundsResult
from bench.status_delay import StatusDelayResult
from bench.step_overhead import GPU_STEPS_MS, StepOverheadResult
from bench.sync_round import SyncResult


@dataclass(frozen=True)
class Target:
    op: Literal[">=", "<="]
    value: float

    def met(self, ratio: float) -> bool:
        return ratio >= self.value if self.op == ">=" else ratio <= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


INNER_LOOP_TARGET = Target(">=", 0.95)
DATA_PATH_TARGET = Target(">=", 10)
# Batches/s over training steps/s: batching costs at most a tenth of a step.
DATA_HEADROOM_TARGET = Target(">=", 10)
SYNC_ROUND_TARGET = Target("<=", 2.5)
# Samples/s with status answers delayed, against none: a late answer must not slow steps.
STATUS_DELAY_TARGET = Target(">=", 0.95)
# Never slower than another executor (Hypha's own, an earlier commit) on the same job.
AGAINST_TARGET = Target(">=", 1.0)
# A GPU step this long keeps at least this share of its speed with the executor's host work.
GPU_STEP_TARGET = Target(">=", 0.95)
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Row:
    """One claim: `measured` against `baseline` from the same run, as `ratio`."""

    benchmark: str
    case: str
    measured: str
    baseline: str
    ratio: float
    target: Target | None = None

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        return "met" if self.target.met(self.ratio) else "GAP"

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "case": self.case,
            "measured": self.measured,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "target": str(self.target) if self.target else None,
            "verdict": self.verdict,
        }


def inner_loop_rows(results: list[InnerLoopResult]) -> list[Row]:
    return [
        Row(
            "inner loop",
            f"{r.model} {r.parameters / 1e6:.2f}M, batch {r.batch_size}"
            + (f", {r.mixed_precision} on {r.device}" if r.mixed_precision != "no" else ""),
            f"{r.executor_samples_per_s:.1f} samples/s",
            f"{r.baseline_samples_per_s:.1f} bare loop "
            f"({', '.join(f'{rate:.1f}' for rate in r.bare_samples_per_s)})",
            r.ratio,
            INNER_LOOP_TARGET,
        )
        for r in results
    ]


def status_delay_rows(results: list[StatusDelayResult]) -> list[Row]:
    baseline = next((r for r in results if r.delay_ms == 0), None)
    if baseline is None:
        return []
    return [
        Row(
            "status delay",
            f"{r.model}, batch {r.batch_size}, answers +{r.delay_ms} ms",
            f"{r.median_samples_per_s:.1f} samples/s, overshoot "
            f"{'/'.join(str(n) for n in r.overshoot)} in {r.rounds} rounds",
            f"{baseline.median_samples_per_s:.1f} at +0 ms",
            r.median_samples_per_s / baseline.median_samples_per_s,
            STATUS_DELAY_TARGET,
        )
        for r in results
        if r is not baseline
    ]


def rounds_rows(results: list[RoundsResult]) -> list[Row]:
    rows = []
    for r in results:
        for delay in r.delays_ms:
            bare = r.median(delay, BASELINE)
            case = f"{r.model}, {r.steps_per_round} batches x {r.rounds}, +{delay} ms"
            for name in r.executors:
                if name == BASELINE:
                    continue
                rows.append(
                    Row(
                        "short rounds",
                        f"{case}: {name}",
                        f"{r.median(delay, name):.1f} samples/s",
                        f"{bare:.1f} bare loop",
                        r.ratio(delay, name, BASELINE),
                    )
                )
            rows.extend(
                Row(
                    "short rounds",
                    f"{case}: executor vs {name}",
                    f"{r.median(delay, EXECUTOR):.1f} samples/s",
                    f"{r.median(delay, name):.1f} {name}",
                    r.ratio(delay, EXECUTOR, name),
                    AGAINST_TARGET if r.same_work else None,
                )
                for name in r.others
            )
    return rows


def step_overhead_rows(results: list[StepOverheadResult]) -> list[Row]:
    rows = []
    for r in results:
        rows.append(
            Row(
                "step overhead",
                "near-free model, host CPU per step",
                f"{r.executor_us:.0f} us",
                f"{r.bare_us:.0f} us bare loop",
                r.executor_us / r.bare_us,
            )
        )
        rows.extend(
            Row(
                "step overhead",
                f"a {gpu_ms:g} ms GPU step's speed",
                f"+{r.overhead_us:.0f} us a step",
                f"{gpu_ms:g} ms alone",
                r.speed_at(gpu_ms),
                GPU_STEP_TARGET,
            )
            for gpu_ms in GPU_STEPS_MS
        )
        rows.append(
            Row(
                "step overhead",
                "AdamW step, demo GPT-2, fused (host CPU)",
                f"{r.adamw_fused_us:.0f} us",
                f"{r.adamw_default_us:.0f} us torch's default",
                r.adamw_fused_us / r.adamw_default_us,
            )
        )
    return rows


def data_path_rows(results: list[DataPathResult], train_steps_per_s: float | None) -> list[Row]:
    rows = [
        Row(
            "data path",
            f"{r.slice}, batch {r.batch_size}",
            f"{_count(r.executor_batches_per_s)} batches/s",
            f"{_count(r.naive_batches_per_s)} per-sample+collate",
            r.speedup,
            DATA_PATH_TARGET,
        )
        for r in results
    ]
    if train_steps_per_s is not None and results:
        slowest = min(results, key=lambda r: r.executor_batches_per_s)
        rows.append(
            Row(
                "data path",
                "batches/s vs training steps/s",
                f"{_count(slowest.executor_batches_per_s)} batches/s",
                f"{train_steps_per_s:.1f} train steps/s",
                slowest.executor_batches_per_s / train_steps_per_s,
                DATA_HEADROOM_TARGET,
            )
        )
    return rows


def sync_round_rows(results: list[SyncResult]) -> list[Row]:
    return [
        Row(
            "sync round",
            f"{r.parameters / 1e6:.2f}M, {DTYPE_NAMES[r.dtype]} {r.bytes_out / 1e6:.1f} MB",
            f"{r.sync_s * 1e3:.1f} ms",
            f"{r.save_file_s * 1e3:.1f} ms save_file",
            r.ratio,
            SYNC_ROUND_TARGET,
        )
        for r in results
    ]


def pseudo_gradient_rows(runs: list[DtypeRun]) -> list[Row]:
    if len(runs) != 2:
        return []
    fp32, bf16 = runs
    return [
        Row(
            "pseudo-gradient",
            "sent per round, bf16 vs fp32",
            f"{bf16.bytes_per_round / 1e6:.3f} MB",
            f"{fp32.bytes_per_round / 1e6:.3f} MB",
            bf16.bytes_per_round / fp32.bytes_per_round,
        ),
        Row(
            "pseudo-gradient",
            "demo final loss, bf16 vs fp32",
            f"{bf16.final_loss:.3f} (from {bf16.first_loss:.3f})",
            f"{fp32.final_loss:.3f} (from {fp32.first_loss:.3f})",
            bf16.final_loss / fp32.final_loss,
        ),
    ]


def _count(value: float) -> str:
    return f"{value / 1e3:.1f}k" if value >= 1e4 else f"{value:.0f}"


HEADER = ("benchmark", "case", "measured", "baseline (same run)", "ratio", "target", "verdict")


def table(rows: list[Row]) -> str:
    cells = [HEADER] + [
        (
            row.benchmark,
            row.case,
            row.measured,
            row.baseline,
            f"{row.ratio:.3g}",
            str(row.target or "-"),
            row.verdict,
        )
        for row in rows
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    # allow_nan=False: a NaN here is a bug in a benchmark, better found than written.
    path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def plot(path: Path, inner: list[InnerLoopResult], sync: list[SyncResult]) -> None:
    """Round overhead and samples/s against model size, each beside its baseline."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 4.8))
    _series(
        left,
        [
            (r.parameters, r.sync_s * 1e3, r.save_file_s * 1e3, r.ratio)
            for r in sync
            if r.dtype == "float32"
        ],
        ("sync round, fp32 (executor, excl. waiting)", "one save_file (baseline)"),
    )
    _axes(left, "DiLoCo sync round overhead", "milliseconds per round")
    _series(
        right,
        [
            (r.parameters, r.executor_samples_per_s, r.baseline_samples_per_s, r.ratio)
            for r in inner
        ],
        ("executor", "bare PyTorch loop (baseline)"),
    )
    _axes(right, "inner-loop throughput", "samples per second")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def _series(
    axes: Any, points: list[tuple[int, float, float, float]], labels: tuple[str, str]
) -> None:
    """The measured line and its baseline, each measured point labelled with its ratio."""
    if not points:
        axes.text(0.5, 0.5, "not measured in this run", ha="center", transform=axes.transAxes)
        return
    sizes = [point[0] for point in points]
    axes.plot(sizes, [point[1] for point in points], marker="o", label=labels[0])
    axes.plot(sizes, [point[2] for point in points], marker="s", linestyle="--", label=labels[1])
    for size, measured, _, ratio in points:
        axes.annotate(f"{ratio:.2f}x", (size, measured), textcoords="offset points", xytext=(5, 6))
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.legend()


def _axes(axes: Any, title: str, ylabel: str) -> None:
    from matplotlib.ticker import FuncFormatter

    # Plain numbers on the log axes: "20", not "2 x 10^1".
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    axes.set_xlabel("model parameters")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3, which="both")

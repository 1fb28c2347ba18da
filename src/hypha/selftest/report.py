"""The selftest's findings, its table, and its verdict: pure functions of plain data, so
that the verdict logic is tested with made-up devices and figures."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from hypha.selftest.devices import Host
from hypha.selftest.runs import BareRun, ExecutorRun, OomCheck
from hypha.selftest.workload import ModelSize

# Below this share of the bare loop's speed the verdict warns: the executor's own cost per
# step is then worth a look (bench/ measures its parts). It does not fail the host.
SLOW_RATIO = 0.9
GIB = 1 << 30


@dataclass
class Report:
    version: str
    host: Host
    size: ModelSize
    parameters: int
    multiplied_parameters: int  # without the position embeddings (looked up, not multiplied)
    mixed_precision: str
    config: str  # the accelerate config's name and distributed type
    processes: int
    generation: str = "alpha17"  # the bridge generation the stand-in played
    speculative_step: str = "auto"  # the action loop's --speculative-step
    answer_delay_ms: float = 0.0  # each scheduler answer held back this long
    compile: str = "auto"  # the executor's HYPHA_COMPILE
    executor: ExecutorRun | None = None
    bare: list[BareRun] = field(default_factory=list)  # before and after the executor
    oom: OomCheck | None = None
    allreduce_bytes_per_s: float | None = None
    peak_tflops: float | None = None  # per device, for the precision trained
    skipped: dict[str, str] = field(default_factory=dict)  # part -> why
    errors: dict[str, str] = field(default_factory=dict)  # part -> what went wrong

    @property
    def bare_samples_per_s(self) -> float | None:
        rates = [run.samples_per_s for run in self.bare]
        return sum(rates) / len(rates) if rates else None

    @property
    def ratio(self) -> float | None:
        executor = self.executor.samples_per_s if self.executor else None
        bare = self.bare_samples_per_s
        return executor / bare if executor and bare else None

    def tokens_per_s(self, samples_per_s: float | None) -> float | None:
        return None if samples_per_s is None else samples_per_s * self.size.seq_len

    def mfu(self, samples_per_s: float | None) -> float | None:
        """Model FLOP utilisation: the model's training FLOPs at this speed over the
        devices' summed peak."""
        tokens = self.tokens_per_s(samples_per_s)
        if tokens is None or self.peak_tflops is None:
            return None
        flops = tokens * self.size.flops_per_token(self.multiplied_parameters)
        devices = self.host.gpus or 1
        return flops / (self.peak_tflops * 1e12 * min(devices, self.processes))


@dataclass(frozen=True)
class Verdict:
    passed: bool
    failures: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def line(self) -> str:
        if not self.passed:
            return "FAIL: " + "; ".join(self.failures)
        if self.warnings:
            return "PASS, with warnings: " + "; ".join(self.warnings)
        return "PASS: this host trains with this executor"


def judge(report: Report) -> Verdict:
    failures = [f"{part}: {error}" for part, error in report.errors.items()]
    warnings: list[str] = []
    if report.host.driver_runs is False:
        failures.append(f"driver: {report.host.driver_line}")
    run = report.executor
    if run is not None:
        if run.timed_out:
            failures.append(
                f"the executor's job was cancelled after {run.seconds:.0f} s (--timeout)"
            )
        elif run.exit_code != 0:
            failures.append(f"the executor exited with {run.exit_code}")
        losses = run.losses
        if len(losses) < 2:
            failures.append(f"the executor reported {len(losses)} round loss(es), not 2 or more")
        elif not all(math.isfinite(x) for x in losses) or losses[-1] >= losses[0]:
            failures.append(f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        if report.host.gpus and run.exit_code == 0 and run.peak_memory_bytes is None:
            failures.append("the executor did not train on the GPU (it reported no GPU memory)")
    if report.oom is not None and not report.oom.passed:
        failures.append(
            f"out-of-memory micro-batching: {report.oom.error or 'the batch fit in one piece'}"
        )
    ratio = report.ratio
    if ratio is not None and ratio < SLOW_RATIO:
        warnings.append(f"the executor ran at {ratio:.3f} of the bare loop's speed")
    return Verdict(not failures, tuple(failures), tuple(warnings))


def render(report: Report, verdict: Verdict) -> str:
    """The table: one row per finding, then the verdict."""
    host = report.host
    rows: list[tuple[str, str]] = [
        ("torch", f"{host.torch_version} ({host.runtime})"),
        ("driver", host.driver_line),
    ]
    for device in host.devices:
        rows.append((f"device {device.index}", describe_device(device)))
    size = report.size
    rows.append((
        "model",
        f"{size.name}: GPT-2 of {report.parameters / 1e6:.1f}M parameters, batch {size.batch_size} "
        f"x {size.seq_len} tokens, mixed precision {report.mixed_precision}",
    ))  # fmt: skip
    rows.append(("accelerate", f"{report.config}, {report.processes} process(es)"))
    protocol = "alpha.17 statuses"
    if report.generation != "alpha17":
        protocol = f"action protocol, speculative step {report.speculative_step}"
    late = f", answers {report.answer_delay_ms:g} ms late" if report.answer_delay_ms else ""
    rows.append(("bridge", f"{protocol}, against the local stand-in{late}"))
    run = report.executor
    if run is not None:
        extra = run.first_round_extra_s(report.size.batch_size)
        rows.append((
            "compile",
            f"HYPHA_COMPILE={report.compile}; the bare loop is eager"
            + ("" if extra is None else f"; the first round's steps took {extra:.1f} s longer "
               "than a later round's (compiling, warm-up; the executor's log says which)"),
        ))  # fmt: skip
    if run is not None:
        losses = run.losses
        loss = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no loss reported"
        rows.append((
            "executor",
            f"{speed(run.samples_per_s, report)} (median of the {len(run.rounds) - 1} rounds "
            "after the first), "
            f"{loss}, exit {run.exit_code}, {run.seconds:.0f} s",
        ))  # fmt: skip
    if report.bare:
        each = ", ".join(f"{b.samples_per_s:.1f}" for b in report.bare)
        rows.append(("bare loop", f"{speed(report.bare_samples_per_s, report)} (runs: {each})"))
    if report.ratio is not None:
        rows.append(("ratio", f"{report.ratio:.3f} of the bare loop's samples/s"))
    rows.append(("MFU", describe_mfu(report)))
    rows.append(("peak memory", describe_memory(report)))
    rows.append(("all-reduce", describe_allreduce(report)))
    rows.append(("OOM check", describe_oom(report)))
    for part, why in report.skipped.items():
        if part not in ("MFU", "all-reduce", "OOM check"):
            rows.append((part, f"skipped: {why}"))
    for part, error in report.errors.items():
        rows.append((part, f"error: {error}"))
    rows.append(("verdict", verdict.line()))
    width = max(len(name) for name, _ in rows)
    title = f"hypha-accelerate selftest ({report.version})"
    return "\n".join([title, *(f"{name:<{width}}  {value}" for name, value in rows)])


def describe_device(device: Any) -> str:
    parts = [device.name]
    if device.memory_bytes is not None:
        parts.append(f"{device.memory_bytes / GIB:.1f} GiB")
    if device.capability is not None:
        parts.append(f"compute capability {device.capability[0]}.{device.capability[1]}")
    parts.append(f"bf16 {'yes' if device.bf16 else 'no'}")
    parts.append(f"TF32 {'yes' if device.tf32 else 'no'}")
    return ", ".join(parts)


def speed(samples_per_s: float | None, report: Report) -> str:
    if samples_per_s is None:
        return "no speed measured"
    tokens = report.tokens_per_s(samples_per_s) or 0.0
    return f"{samples_per_s:.1f} samples/s, {tokens:,.0f} tokens/s"


def describe_mfu(report: Report) -> str:
    if report.peak_tflops is None:
        return f"n/a: {report.skipped.get('MFU', 'no peak known for this device')}"
    flops = report.size.flops_per_token(report.multiplied_parameters)
    precision = "bf16" if report.mixed_precision == "bf16" else "fp32"
    executor = report.mfu(report.executor.samples_per_s if report.executor else None)
    bare = report.mfu(report.bare_samples_per_s)
    shown = [
        f"{name} {100 * value:.1f} %"
        for name, value in (("executor", executor), ("bare loop", bare))
        if value is not None
    ]
    return (
        f"{', '.join(shown) or 'no speed measured'} (model {flops / 1e9:.2f} GFLOP/token "
        f"against a peak of {report.peak_tflops:g} TFLOP/s {precision} "
        "per device, from the device's data sheet)"
    )


def describe_memory(report: Report) -> str:
    parts = []
    if report.executor and report.executor.peak_memory_bytes is not None:
        parts.append(f"executor {report.executor.peak_memory_bytes / GIB:.2f} GiB")
    peaks = [b.peak_memory_bytes for b in report.bare if b.peak_memory_bytes is not None]
    if peaks:
        parts.append(f"bare loop {max(peaks) / GIB:.2f} GiB")
    return ", ".join(parts) + " (torch's allocator, rank 0)" if parts else "n/a: no GPU"


def describe_allreduce(report: Report) -> str:
    if report.allreduce_bytes_per_s is None:
        return f"n/a: {report.skipped.get('all-reduce', 'not measured')}"
    return f"{report.allreduce_bytes_per_s / 1e9:.1f} GB/s bus bandwidth over {report.host.gpus} devices"


def describe_oom(report: Report) -> str:
    check = report.oom
    if check is None:
        return f"n/a: {report.skipped.get('OOM check', 'not run')}"
    head = f"batch {check.batch_size} under a {check.cap_bytes / GIB:.2f} GiB cap"
    if check.error:
        return f"{head}: {check.error}"
    if not check.halved:
        return f"{head}: fit in one piece (the cap did not bind)"
    losses = ", ".join(f"{x:.3f}" for x in check.losses)
    return (
        f"{head}: halved to micro-batches of {check.micro_batch_size}, "
        f"trained {len(check.losses)} steps (loss {losses})"
    )


def as_json(report: Report, verdict: Verdict) -> dict[str, Any]:
    data = asdict(report)
    data["figures"] = {
        "executor_samples_per_s": report.executor.samples_per_s if report.executor else None,
        "bare_samples_per_s": report.bare_samples_per_s,
        "ratio": report.ratio,
        "executor_mfu": report.mfu(report.executor.samples_per_s if report.executor else None),
        "bare_mfu": report.mfu(report.bare_samples_per_s),
        "flops_per_token": report.size.flops_per_token(report.multiplied_parameters),
        "executor_tokens_per_s": report.tokens_per_s(
            report.executor.samples_per_s if report.executor else None
        ),
        "executor_peak_memory_bytes": report.executor.peak_memory_bytes
        if report.executor
        else None,
        "first_round_extra_s": report.executor.first_round_extra_s(report.size.batch_size)
        if report.executor
        else None,
    }
    data["verdict"] = {"passed": verdict.passed, "line": verdict.line()}
    return data

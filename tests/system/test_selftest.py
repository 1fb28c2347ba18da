"""`selftest`: its verdict and table from made-up devices and figures; the host facts it
reads (driver verdict, peak rates, configs); and the CPU path end to end, which is what a
host without a GPU (and CI) runs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from hypha.selftest.command import accelerate_config
from hypha.selftest.devices import (
    Device,
    Host,
    nvidia_driver_verdict,
    peak_tflops,
)
from hypha.selftest.report import Report, as_json, judge, render
from hypha.selftest.runs import BareRun, ExecutorRun, OomCheck
from hypha.selftest.workload import SIZES

H100 = Device(0, "NVIDIA H100 80GB HBM3", 85_031_714_816, (9, 0), bf16=True, tf32=True)
GPU_HOST = Host(
    "cuda", "2.11.0+cu130", "CUDA 13.0", (H100,), "NVIDIA driver 580.159.04 runs cu130", True
)
CPU_HOST = Host(
    "cpu", "2.13.0+cpu", "-", (Device(0, "CPU", None, None, True, False),), "no GPU", None
)
GIB = 1 << 30


def executor_run(
    losses: tuple[float, ...] = (10.8, 10.6, 10.5),
    rate: float = 128.0,
    exit_code: int = 0,
    peak: float | None = 23.6 * GIB,
) -> ExecutorRun:
    rounds = {}
    for number, loss in enumerate(losses, start=1):
        metrics = {"loss": loss, "samples_per_second": rate}
        if peak is not None:
            metrics["peak_device_memory_bytes"] = peak
        rounds[number] = metrics
    return ExecutorRun(exit_code, rounds, 40.0)


def gpu_report(**changes: object) -> Report:
    size = SIZES["gpt2-124m"]
    report = Report(
        "0.1.0",
        GPU_HOST,
        size,
        124_439_808,
        124_439_808 - 1024 * 768,
        "bf16",
        "auto (NO)",
        1,
        executor=executor_run(),
        bare=[BareRun([127.0], [10.7], 23 * GIB), BareRun([129.0], [10.7], 23 * GIB)],
        oom=OomCheck(64, 37 * GIB, 16, losses=[11.6, 10.6]),
        peak_tflops=989.4,
        skipped={"all-reduce": "one device"},
    )
    return replace(report, **changes)  # type: ignore[arg-type]


def test_a_gpu_host_that_trains_passes_with_its_figures_in_the_table() -> None:
    report = gpu_report()
    verdict = judge(report)
    assert verdict.passed and verdict.exit_code == 0 and not verdict.warnings
    table = render(report, verdict)
    assert "NVIDIA H100 80GB HBM3, 79.2 GiB, compute capability 9.0, bf16 yes, TF32 yes" in table
    assert "ratio        1.000 of the bare loop's samples/s" in table
    # 128 samples/s x 1024 tokens x (6 N + 12 L d T) FLOPs over 989.4 TFLOP/s
    flops = 128 * 1024 * (6 * (124_439_808 - 1024 * 768) + 12 * 12 * 768 * 1024)
    assert f"executor {100 * flops / 989.4e12:.1f} %" in table
    assert "halved to micro-batches of 16, trained 2 steps" in table
    assert "all-reduce   n/a: one device" in table
    assert table.splitlines()[-1] == "verdict      PASS: this host trains with this executor"


def test_the_first_rounds_extra_time_is_said_beside_the_compile_setting() -> None:
    run = executor_run()
    run.rounds[1].update(samples_per_second=32.0, batches=40.0)  # 20 s, against 5 s
    for number in (2, 3):
        run.rounds[number]["batches"] = 40.0
    report = gpu_report(executor=run, compile="on")
    table = render(report, judge(report))
    assert (
        "compile      HYPHA_COMPILE=on; the bare loop is eager; the first round's steps took "
        "15.0 s longer than a later round's"
    ) in table
    assert as_json(report, judge(report))["figures"]["first_round_extra_s"] == 15.0


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({"executor": executor_run(exit_code=1)}, "the executor exited with 1"),
        (
            {"executor": replace(executor_run(exit_code=143), timed_out=True)},
            "the executor's job was cancelled after 40 s (--timeout)",
        ),
        (
            {"executor": executor_run(losses=(10.8, 10.9))},
            "the loss did not fall (10.8000 -> 10.9000)",
        ),
        ({"executor": executor_run(losses=(10.8,))}, "reported 1 round loss(es)"),
        ({"executor": executor_run(losses=(10.8, float("nan")))}, "the loss did not fall"),
        # A GPU image that fell back to the CPU reports no GPU memory.
        ({"executor": executor_run(peak=None)}, "did not train on the GPU"),
        (
            {
                "host": replace(
                    GPU_HOST, driver_runs=False, driver_line="NVIDIA driver 520 cannot run cu130"
                )
            },
            "driver: NVIDIA driver 520 cannot run cu130",
        ),
        ({"oom": OomCheck(64, GIB, 64, losses=[1.0])}, "the batch fit in one piece"),
        (
            {"oom": OomCheck(64, GIB, 1, error="out of memory even in micro-batches of 1 sample")},
            "out of memory even in micro-batches of 1 sample",
        ),
        ({"errors": {"bare loop": "RuntimeError: boom"}}, "bare loop: RuntimeError: boom"),
    ],
)
def test_each_failure_fails_the_verdict_and_is_named(
    changes: dict[str, object], failure: str
) -> None:
    verdict = judge(gpu_report(**changes))
    assert not verdict.passed and verdict.exit_code == 1
    assert failure in verdict.line()
    assert verdict.line().startswith("FAIL: ")


def test_a_slow_executor_passes_with_a_warning() -> None:
    verdict = judge(gpu_report(executor=executor_run(rate=100.0)))
    assert verdict.passed
    assert (
        verdict.line() == "PASS, with warnings: the executor ran at 0.781 of the bare loop's speed"
    )


def test_a_cpu_host_says_what_it_did_not_measure() -> None:
    report = gpu_report(
        host=CPU_HOST,
        mixed_precision="no",
        executor=executor_run(peak=None),
        bare=[BareRun([120.0], [10.7], None)],
        oom=None,
        peak_tflops=None,
        skipped={"MFU": "no GPU", "OOM check": "no GPU", "all-reduce": "no GPU"},
    )
    verdict = judge(report)
    assert verdict.passed
    table = render(report, verdict)
    for row in ("MFU          n/a: no GPU", "peak memory  n/a: no GPU", "OOM check    n/a: no GPU"):
        assert row in table


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA GH200 480GB", "no", 66.9),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_peak_rates_come_from_the_device_name(
    name: str, precision: str, peak: float | None
) -> None:
    assert peak_tflops(name, precision) == peak


def test_the_driver_verdict_is_the_launchers(tmp_path: Path) -> None:
    version_file = tmp_path / "version"
    env = {"HYPHA_NVIDIA_DRIVER_VERSION_FILE": str(version_file)}
    version_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue\n")
    line, runs = nvidia_driver_verdict("13.0", env)
    assert runs is True and line.startswith(
        "NVIDIA driver 580.159.04 runs cu130 (CUDA 13.0) natively"
    )
    version_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat\n")
    line, runs = nvidia_driver_verdict("13.0", {**env, "HYPHA_VARIANT": "cu130"})
    assert runs is False and "cannot run cu130" in line
    version_file.write_text("no version here\n")
    line, runs = nvidia_driver_verdict("13.0", env)
    assert runs is False and line.startswith("no NVIDIA driver version readable")


def test_configs_take_the_commands_precision_and_processes() -> None:
    config, name = accelerate_config("auto", CPU_HOST, 1, "no")
    assert name == "auto (NO)" and config["use_cpu"] is True and config["num_processes"] == 1
    config, name = accelerate_config("auto", replace(GPU_HOST, devices=(H100, H100)), 2, "bf16")
    assert name == "auto (MULTI_GPU)" and config["mixed_precision"] == "bf16"
    config, name = accelerate_config("fsdp", GPU_HOST, 1, "no")
    assert name == "fsdp (FSDP)" and config["num_processes"] == 1
    assert config["mixed_precision"] == "no" and config["fsdp_config"]["fsdp_version"] == 2


def test_gpt2_124m_is_gpt2_small() -> None:
    from hypha.selftest.command import parameter_counts

    total, multiplied = parameter_counts(SIZES["gpt2-124m"])
    assert total == 124_439_808  # GPT-2 small, tied embeddings counted once
    assert multiplied == total - 1024 * 768


@pytest.mark.slow
def test_allreduce_bandwidth_over_two_cpu_processes() -> None:
    from hypha.selftest.runs import allreduce_bus_bandwidth

    assert allreduce_bus_bandwidth(2, "cpu", size_bytes=1 << 20, iterations=3) > 0


@pytest.mark.slow
@pytest.mark.parametrize("generation", ["alpha17", "actions"])
def test_selftest_trains_on_the_cpu_through_the_executor(tmp_path: Path, generation: str) -> None:
    """The path a host without a GPU runs: launcher, training rank, bridge, stand-in."""
    findings = tmp_path / "selftest.json"
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", "selftest",
         "--rounds", "3", "--steps-per-round", "5", "--bridge-generation", generation,
         "--answer-delay-ms", "20", "--json", str(findings)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.splitlines()
    assert table[0].startswith("hypha-accelerate selftest")
    assert table[-1].startswith("verdict      PASS")
    assert any(line.startswith("executor     ") and "exit 0" in line for line in table)
    report = json.loads(findings.read_text())
    assert report["host"]["backend"] == "cpu"
    assert report["figures"]["executor_samples_per_s"] > 0
    assert report["figures"]["bare_samples_per_s"] > 0
    rounds = sorted(report["executor"]["rounds"].items(), key=lambda item: int(item[0]))
    losses = [metrics["loss"] for _, metrics in rounds]
    assert losses[-1] < losses[0]
    assert report["generation"] == generation
    [bridge] = [line for line in table if line.startswith("bridge ")]
    assert bridge.endswith("answers 20 ms late")
    if generation == "actions":
        # The executor's default, auto: its trials and choice are its own lines.
        assert "speculative step auto" in bridge and "speculative step auto" in done.stderr
    # The executor's lines are progress, on stderr, and the table alone is on stdout.
    assert "[selftest] round 1: loss" in done.stderr
    assert not any("round 1: loss" in line for line in table)


def test_a_bad_skip_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.cli", "selftest", "--skip", "bare,gpu"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "selftest: --skip names no part gpu; parts: bare, oom, allreduce"
    )


def test_the_written_config_is_what_accelerate_reads(tmp_path: Path) -> None:
    config, _ = accelerate_config("deepspeed-zero2", GPU_HOST, 1, "bf16")
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type.value == "DEEPSPEED" and loaded.num_processes == 1

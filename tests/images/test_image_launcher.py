"""The in-container launcher, run as a real process: config choice, GPU counting from
/dev, argument errors, and signals reaching every process of the job."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.launcher import command, discovery
from hypha.accelerate_executor.platform.launcher import plan as planning

CONFIGS = Path(__file__).resolve().parents[2] / "accelerate-configs"


def launch(*args: str, variant: str | None = "cpu") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYPHA_VARIANT"}
    env["HYPHA_ACCELERATE_CONFIGS"] = str(CONFIGS)
    if variant:
        env["HYPHA_VARIANT"] = variant
    return subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.platform.launcher", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def printed(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    head = result.stdout.split("\n--- ", 1)[0]
    return dict(line.split(": ", 1) for line in head.splitlines())


def fake_dev(root: Path, nodes: list[str]) -> Path:
    dev = root / "dev"
    for node in nodes:
        (dev / node).parent.mkdir(parents=True, exist_ok=True)
        (dev / node).touch()
    return dev


def test_cpu_auto_runs_the_training_module_directly() -> None:
    shown = printed(launch("--print-config"))
    assert shown["accelerate config"].startswith(str(CONFIGS / "cpu.yaml"))
    assert shown["num processes"] == "1"
    assert shown["command"].split()[1:3] == ["-m", "hypha.accelerate_executor.training"]
    assert "ACCELERATE_USE_CPU=True" in shown["env"]


@pytest.mark.parametrize(
    ("variant", "runtime"),
    [("cu126", "--gpus all"), ("cu130", "--gpus all"), ("rocm64", "--device /dev/kfd")],
)
def test_gpu_image_without_gpus_trains_on_the_cpu_and_says_why(variant: str, runtime: str) -> None:
    shown = printed(launch("--print-config", variant=variant))
    assert shown["accelerate config"].startswith(str(CONFIGS / "cpu.yaml"))
    assert f"the {variant} image sees no GPU" in shown["accelerate config"]
    assert runtime in shown["accelerate config"]


def test_cpu_with_several_processes_goes_through_accelerate_launch() -> None:
    shown = printed(launch("--print-config", "--num-processes", "2"))
    assert shown["accelerate config"].startswith(str(CONFIGS / "multi-cpu.yaml"))
    assert "-m accelerate.commands.launch" in shown["command"]
    assert "--num_processes 2" in shown["command"]
    # accelerate's own MULTI_CPU path needs mpirun; torchrun's plus this env does it.
    assert "--multi_gpu" in shown["command"]
    assert shown["env"] == "ACCELERATE_USE_CPU=True"


@pytest.mark.parametrize(
    ("requested", "expected"),
    [("fsdp", "fsdp.yaml"), ("deepspeed-zero3", "deepspeed-zero3.yaml"), ("mps", "mps.yaml")],
)
def test_a_named_config_is_used_as_given(requested: str, expected: str) -> None:
    shown = printed(
        launch("--print-config", "--accelerate-config", requested, "--num-processes", "1")
    )
    assert shown["accelerate config"] == f"{CONFIGS / expected} (given)"


def test_a_config_path_is_used_as_given(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text((CONFIGS / "cpu.yaml").read_text().replace("'no'", "bf16"))
    shown = printed(launch("--print-config", "--accelerate-config", str(own)))
    assert shown["accelerate config"] == f"{own} (given)"
    assert "ACCELERATE_MIXED_PRECISION=bf16" in shown["env"]


def test_the_job_json_never_shows_in_the_printed_command() -> None:
    secret = '{"token": "hf_launcherSecret"}'
    result = launch(
        "--print-config", "--socket", "/w/bridge.sock", "--work-dir", "/w", "--job", secret
    )
    assert "hf_launcherSecret" not in result.stdout + result.stderr
    assert f"<job JSON, {len(secret)} bytes>" in printed(result)["command"]
    assert (
        "--job @/w/job.json"
        in printed(launch("--print-config", "--job", "@/w/job.json"))["command"]
    )


@pytest.mark.parametrize(
    ("args", "variant", "message"),
    [
        (["--socket", "/s"], "cpu", "missing --work-dir, --job"),
        (["--bogus"], "cpu", "unrecognized arguments: --bogus"),
        (
            ["--print-config", "--accelerate-config", "nope"],
            "cpu",
            "no accelerate config named 'nope'",
        ),
        (["--print-config", "--accelerate-config", "/no/such.yaml"], "cpu", "does not exist"),
        (["--print-config", "--num-processes", "0"], "cpu", "at least 1"),
        (
            ["--print-config", "--accelerate-config", "gpu", "--num-processes", "2"],
            "cpu",
            "runs one process",
        ),
        (["--print-config"], "tpu", "HYPHA_VARIANT='tpu' is not one of"),
        (["--print-config", "--accelerate-config", "multi-gpu"], "cu129", "needs GPUs"),
    ],
)
def test_bad_arguments_end_in_one_line_and_exit_2(
    args: list[str], variant: str, message: str
) -> None:
    result = launch(*args, variant=variant)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("launcher: ") and message in result.stderr


def test_version_and_help_need_no_socket() -> None:
    version = launch("--version")
    assert version.returncode == 0
    assert version.stdout.split()[:2] == ["hypha-accelerate-executor", __version__]
    assert launch("--help").returncode == 0


def test_the_launcher_does_not_import_torch() -> None:
    probe = (
        "import sys\n"
        "from hypha.accelerate_executor.platform.launcher.command import main\n"
        "main(['--print-config'])\n"
        "sys.exit(1 if 'torch' in sys.modules else 0)\n"
    )
    env = {**os.environ, "HYPHA_ACCELERATE_CONFIGS": str(CONFIGS), "HYPHA_VARIANT": "cpu"}
    assert (
        subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0
    )


def test_nvidia_gpus_are_counted_from_dev_and_narrowed_by_cuda_visible_devices(
    tmp_path: Path,
) -> None:
    dev = fake_dev(
        tmp_path, ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-caps/x"]
    )
    assert discovery.count_gpus("cu126", {}, dev) == 3
    assert discovery.count_gpus("cu129", {"CUDA_VISIBLE_DEVICES": "0,2"}, dev) == 2
    assert discovery.count_gpus("cu126", {"CUDA_VISIBLE_DEVICES": ""}, dev) == 0
    assert discovery.count_gpus("cu126", {"CUDA_VISIBLE_DEVICES": "-1"}, dev) == 0
    assert discovery.count_gpus("cpu", {}, dev) == 0
    assert discovery.image_variant({}, dev) == "cu126"


def test_amd_gpus_are_render_nodes_of_vendor_0x1002_beside_kfd(tmp_path: Path) -> None:
    dev = fake_dev(tmp_path, ["dri/renderD128", "dri/renderD129", "dri/renderD130", "dri/card0"])
    sys_root = tmp_path / "sys"
    for node, vendor in (
        ("renderD128", "0x1002"),
        ("renderD129", "0x1002"),
        ("renderD130", "0x8086"),
    ):
        vendor_file = sys_root / "class" / "drm" / node / "device" / "vendor"
        vendor_file.parent.mkdir(parents=True)
        vendor_file.write_text(vendor + "\n")
    assert discovery.count_gpus("rocm64", {}, dev, sys_root) == 0  # no /dev/kfd: no ROCm
    (dev / "kfd").touch()
    assert discovery.count_gpus("rocm64", {}, dev, sys_root) == 2
    assert discovery.count_gpus("rocm64", {"HIP_VISIBLE_DEVICES": "1"}, dev, sys_root) == 1
    assert discovery.image_variant({}, dev) == "rocm64"


def plan_for(tmp_path: Path, variant: str, gpus: int, *args: str) -> planning.Plan:
    dev = fake_dev(tmp_path, [f"nvidia{i}" for i in range(gpus)])
    parsed: argparse.Namespace = command.parser().parse_args(
        ["--socket", "/w/bridge.sock", "--work-dir", "/w", "--job", "@/w/job.json", *args]
    )
    env = {"HYPHA_VARIANT": variant, "HYPHA_ACCELERATE_CONFIGS": str(CONFIGS)}
    return planning.plan(parsed, env, dev, tmp_path / "sys")


def test_one_gpu_runs_gpu_yaml_directly_with_bf16(tmp_path: Path) -> None:
    p = plan_for(tmp_path, "cu126", 1)
    assert p.config_path.name == "gpu.yaml" and p.num_processes == 1 and p.direct
    assert p.env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert p.env["ACCELERATE_USE_CPU"] == "False"


def test_several_gpus_run_multi_gpu_yaml_one_process_each(tmp_path: Path) -> None:
    p = plan_for(tmp_path, "cu129", 4)
    assert p.config_path.name == "multi-gpu.yaml" and p.num_processes == 4 and not p.direct
    assert p.command[p.command.index("--num_processes") + 1] == "4"
    assert p.command[-6:] == [
        "--socket",
        "/w/bridge.sock",
        "--work-dir",
        "/w",
        "--job",
        "@/w/job.json",
    ]


def test_fsdp_on_four_gpus_shards_over_all_four(tmp_path: Path) -> None:
    p = plan_for(tmp_path, "cu126", 4, "--accelerate-config", "fsdp")
    assert p.distributed_type == "FSDP" and p.num_processes == 4


def test_num_processes_overrides_the_gpu_count(tmp_path: Path) -> None:
    p = plan_for(tmp_path, "cu126", 4, "--num-processes", "2")
    assert p.config_path.name == "multi-gpu.yaml" and p.num_processes == 2
    assert (
        plan_for(tmp_path / "b", "cu126", 4, "--num-processes", "1").config_path.name == "gpu.yaml"
    )


# The job stand-in for the signal tests: a process group of a parent that records SIGTERM
# and a grandchild that would outlive it, as accelerate's ranks or a dataloader worker could.
JOB = """
import os, signal, subprocess, sys, time
marker = sys.argv[1]
stubborn = sys.argv[2] == "stubborn"
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(marker + ".grandchild", "w").write(str(grandchild.pid))
def on_term(signum, frame):
    open(marker + ".term", "w").write("got SIGTERM")
    if not stubborn:
        sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(marker + ".ready", "w").write("")
while True:
    time.sleep(0.05)
"""


def supervise(tmp_path: Path, mode: str) -> tuple[int, Path]:
    marker = tmp_path / "job"
    supervisor = (
        "import sys\n"
        "from hypha.accelerate_executor.platform.launcher.command import run_ranks\n"
        f"sys.exit(run_ranks([sys.executable, '-c', {JOB!r}, {str(marker)!r}, {mode!r}], {{}}))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", supervisor])
    deadline = time.monotonic() + 30
    while not (tmp_path / "job.ready").exists():
        assert time.monotonic() < deadline, "the job stand-in did not start"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    # Generous: a stubborn job is killed supervisor.GRACE_S (2.5 s) after the SIGTERM.
    return process.wait(timeout=15), marker


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; it waits only for its parent to reap it.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("mode", ["polite", "stubborn"])
def test_sigterm_reaches_the_whole_job_and_ends_it(tmp_path: Path, mode: str) -> None:
    code, marker = supervise(tmp_path, mode)
    assert code == 143
    assert Path(f"{marker}.term").read_text() == "got SIGTERM"
    grandchild = int(Path(f"{marker}.grandchild").read_text())
    time.sleep(0.2)
    assert not alive(grandchild), "a process of the job outlived the launcher"


def test_the_childs_exit_code_passes_through(tmp_path: Path) -> None:
    supervisor = (
        "import sys\n"
        "from hypha.accelerate_executor.platform.launcher.command import run_ranks\n"
        "sys.exit(run_ranks([sys.executable, '-c', 'raise SystemExit(7)'], {}))\n"
    )
    assert subprocess.run([sys.executable, "-c", supervisor]).returncode == 7

"""The cpu image, built offline: labels, an arbitrary non-root uid under the production
hardening, no CUDA libraries, the bundled configs, the launcher as entrypoint, and at most
1.1 GB: what the executor never opens is left out, what it may need is kept and works."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor import __version__
from hypha.accelerate_executor.platform.variants import BY_NAME
from image_harness import ARBITRARY_USER, ROOT, docker_run

pytestmark = pytest.mark.docker

# Runs inside the container as the arbitrary uid: what the process sees of itself.
PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, pathlib, sys
def writable(path):
    try:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(path) / "probe").write_text("x")
        return True
    except OSError:
        return False
import torch, transformers, accelerate, PIL.Image
venv = pathlib.Path(sys.prefix)
site = pathlib.Path(torch.__file__).parents[1]
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "home": os.environ["HOME"],
    "caches": {k: os.environ.get(k) for k in (
        "XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME", "TRITON_CACHE_DIR", "MPLCONFIGDIR",
        "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH")},
    "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
    "cache_writable": writable(os.environ["HF_HOME"]),
    "root_fs_writable": writable("/opt/hypha/probe-dir"),
    "torch": torch.__version__,
    "cuda_built": torch.version.cuda,
    "cuda_packages": sorted(d.metadata["Name"] for d in md.distributions()
                            if d.metadata["Name"].lower().startswith(("nvidia-", "triton"))),
    "cuda_libraries": sorted(p.name for p in venv.rglob("lib*.so*")
                             if p.name.startswith(("libcudart", "libcublas", "libcudnn", "libnccl"))),
    "configs": sorted(p.name for p in pathlib.Path(os.environ["HYPHA_ACCELERATE_CONFIGS"]).iterdir()),
    "pillow": PIL.__version__,
    "pip": importlib.util.find_spec("pip") is not None,
    "torch_bin": sorted(p.name for p in (site / "torch" / "bin").iterdir()),
    "left_out": sorted(str(p.relative_to(site)) for p in (
        site / "torch" / "test", site / "torch" / "include",
        *(p for name in ("numpy", "sympy", "networkx", "mpmath") for p in (site / name).rglob("tests")),
    ) if p.exists()),
}))
"""


SHARED_TENSOR_PROBE = r"""
import torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")
ctx = mp.get_context("fork")
tensor, handoff, done = torch.zeros(4), ctx.Queue(), ctx.Queue()
def child():
    handoff.get().add_(1)
    done.put(True)
process = ctx.Process(target=child)
process.start()
handoff.put(tensor)
done.get(timeout=60)
process.join()
print(tensor.tolist(), tensor.is_shared())
"""


@pytest.fixture(scope="module")
def probe(cpu_image: str) -> dict[str, Any]:
    result = docker_run(cpu_image, "-c", PROBE, options=("--entrypoint", "/opt/venv/bin/python"))
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_labels_state_version_variant_torch_and_revision(docker_api: Any, cpu_image: str) -> None:
    labels = docker_api.inspect_image(cpu_image)["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["io.hypha.accelerate-executor.variant"] == "cpu"
    assert labels["io.hypha.accelerate-executor.torch-version"] == "2.13.0"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels["org.opencontainers.image.revision"])


def test_both_tags_name_the_same_image(docker_api: Any, cpu_image: str) -> None:
    moving = docker_api.inspect_image("hypha-accelerate-executor:cpu")["Id"]
    assert docker_api.inspect_image(cpu_image)["Id"] == moving


def test_runs_as_an_arbitrary_uid_on_a_read_only_root(probe: dict[str, Any]) -> None:
    assert f"{probe['uid']}:{probe['gid']}" == ARBITRARY_USER
    assert probe["home"] == "/tmp"
    assert all(value and value.startswith("/tmp/") for value in probe["caches"].values())
    assert probe["cache_writable"] and not probe["root_fs_writable"]
    assert probe["unbuffered"] == "1"


def test_carries_cpu_torch_and_no_cuda_at_all(probe: dict[str, Any]) -> None:
    assert probe["torch"] == "2.13.0+cpu"
    assert probe["cuda_built"] is None
    assert probe["cuda_packages"] == []
    assert probe["cuda_libraries"] == []


def test_is_at_most_1_1_gb(docker_api: Any, cpu_image: str) -> None:
    assert docker_api.inspect_image(cpu_image)["Size"] <= 1.1e9


def test_leaves_out_what_the_executor_never_opens(probe: dict[str, Any]) -> None:
    # torch's C++ test programs and headers (no compiler here to build against them), the
    # test suites of numpy, sympy, networkx and mpmath, and pip (it only installs).
    assert probe["left_out"] == []
    assert probe["torch_bin"] == ["torch_shm_manager"]
    assert not probe["pip"]


def test_tensors_shared_between_processes_still_work(cpu_image: str) -> None:
    # The file_system strategy hands a storage to another process by name through
    # torch_shm_manager, the one program of torch/bin the image keeps.
    result = docker_run(
        cpu_image, "-c", SHARED_TENSOR_PROBE, options=("--entrypoint", "/opt/venv/bin/python")
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[1.0,", "1.0,", "1.0,", "1.0]", "True"]


def test_carries_pillow_for_image_preprocessors(probe: dict[str, Any]) -> None:
    assert probe["pillow"] == "13.0.0"


def test_bundles_every_accelerate_config(probe: dict[str, Any]) -> None:
    assert probe["configs"] == sorted(p.name for p in (ROOT / "accelerate-configs").glob("*.yaml"))


def test_entrypoint_is_the_launcher(cpu_image: str) -> None:
    version = docker_run(cpu_image, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"hypha-accelerate-executor {__version__} (cpu)"
    shown = docker_run(cpu_image, "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert "accelerate config: /opt/hypha/accelerate-configs/cpu.yaml (auto" in shown.stdout
    assert "command: /opt/venv/bin/python -m hypha.accelerate_executor.training" in shown.stdout


@pytest.mark.slow
def test_selftest_is_a_command_of_the_image(cpu_image: str) -> None:
    """`docker run IMAGE selftest`: a stand-in job trains through the image's launcher,
    rank and bridge, as a non-root uid with no network, and the verdict is the exit code."""
    result = docker_run(
        cpu_image, "selftest", "--rounds", "2", "--steps-per-round", "5", timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout.splitlines()
    assert table[1] == f"torch        {BY_NAME['cpu'].torch_build} (-)"
    assert any(row.startswith("executor ") and "exit 0" in row for row in table)
    assert table[-1].startswith("verdict      PASS")


# The stand-in's modules no worker and no selftest runs (docker/Dockerfile, docs/images.md).
STANDIN_LEFT_OUT = {
    "cli.py", "demo.py", "otlp_receiver.py", "coordinator/server.py",
    "coordinator/http_api.py", "coordinator/client.py", "coordinator/report.py",
}  # fmt: skip


def test_keeps_of_the_stand_in_only_what_selftest_runs(cpu_image: str) -> None:
    """The selftest above proves what is kept suffices; here, the rest is gone, with its
    bytecode, and the command it served says so in one line."""
    listing = docker_run(
        cpu_image,
        "-c",
        "cd /opt/venv/lib/python3.*/site-packages/hypha/standin && find . -name '*.py*'",
        options=("--entrypoint", "sh"),
    )
    assert listing.returncode == 0, listing.stderr
    present = {line.removeprefix("./") for line in listing.stdout.split()}
    assert "worker/bridge_core.py" in present and "coordinator/core.py" in present
    assert not STANDIN_LEFT_OUT & present
    bytecode = {
        str(Path(name).parent / "__pycache__" / Path(name).stem).removeprefix("./")
        for name in STANDIN_LEFT_OUT
    }
    assert not [name for name in present if name.split(".", 1)[0] in bytecode]
    local = docker_run(cpu_image, "local", "demo", options=("--entrypoint", "hypha-accelerate"))
    assert local.returncode == 1
    assert local.stderr.splitlines() == [
        "hypha-accelerate: 'local' is not installed here (hypha.standin.cli is missing)"
    ]


def test_bad_arguments_end_in_one_line_and_exit_2(cpu_image: str) -> None:
    result = docker_run(cpu_image, "--socket", "/nowhere.sock")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "launcher: missing --work-dir, --job (see --help)"
    ]


def test_a_read_only_root_without_tmpfs_is_one_line_and_exit_2(cpu_image: str) -> None:
    result = subprocess.run(
        ["docker", "run", "--rm", "--user", ARBITRARY_USER, "--read-only", cpu_image,
         "--socket", "/w/bridge.sock", "--work-dir", "/w", "--job", "{}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "launcher: HOME /tmp is not writable: give the container a tmpfs there (--tmpfs /tmp)"
    ]


def test_several_cpu_ranks_start_through_accelerate_launch(cpu_image: str) -> None:
    shown = docker_run(cpu_image, "--print-config", "--num-processes", "2")
    assert shown.returncode == 0, shown.stderr
    assert "multi-cpu.yaml" in shown.stdout and "accelerate.commands.launch" in shown.stdout


def test_the_image_holds_no_build_leftovers(cpu_image: str) -> None:
    listing = docker_run(cpu_image, "-c", "ls /; echo ==; ls /opt", options=("--entrypoint", "sh"))
    assert listing.returncode == 0, listing.stderr
    top, opt = (part.split() for part in listing.stdout.split("=="))
    assert not {"wheelhouse", "requirements", "build", "dist", "check_venv.py"} & set(top)
    assert opt == ["hypha", "venv"]

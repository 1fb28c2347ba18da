"""The mps-host bundle: built by `hypha-accelerate build mps-host`, it holds the project
wheel, macOS pins, the mps config and a launcher script that runs the image launcher with
HYPHA_VARIANT=mps-host (its install step needs macOS, so a ready venv stands in for it here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypha.accelerate_executor import __version__
from image_harness import ROOT, hypha_accelerate


def test_mps_host_bundle_holds_wheel_pins_config_and_launcher(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    built = hypha_accelerate("build", "mps-host", "--output", str(bundle), timeout=600)
    assert built.returncode == 0, built.stderr
    assert sorted(p.name for p in bundle.iterdir()) == sorted(
        [
            "accelerate-configs",
            f"hypha_accelerate_executor-{__version__}-py3-none-any.whl",
            "hypha-accelerate-mps",
            "requirements.txt",
        ]
    )
    assert [p.name for p in (bundle / "accelerate-configs").iterdir()] == ["mps.yaml"]
    pins = (bundle / "requirements.txt").read_text().splitlines()
    assert "torch===2.13.0" in pins and not any(line.startswith("-r") for line in pins)
    script = bundle / "hypha-accelerate-mps"
    assert os.access(script, os.X_OK)

    # This interpreter's environment plays the venv the script would make on first use.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    shown = subprocess.run(
        [str(script), "--print-config"],
        capture_output=True,
        text=True,
        env={**os.environ, "HYPHA_MPS_VENV": str(venv)},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "variant: mps-host" in shown.stdout
    assert f"accelerate config: {bundle}/accelerate-configs/mps.yaml (auto" in shown.stdout
    assert "launch: training module directly" in shown.stdout


def test_launcher_script_is_valid_sh() -> None:
    assert (
        subprocess.run(["sh", "-n", str(ROOT / "docker" / "mps-host-launcher.sh")]).returncode == 0
    )

"""bench/activation_checkpointing.py runs end to end at its smoke size (no figure is asserted:
at that size the activations are a few MB of a process's 400)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

BENCH = REPO / "bench" / "activation_checkpointing.py"


@pytest.mark.slow
def test_both_sides_are_measured_and_train_alike(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ratio checkpointed/kept: peak" in done.stdout
    result = json.loads(figures.read_text())
    for side in ("kept", "checkpointed"):
        assert result[side]["peak_bytes"] >= result[side]["before_steps_bytes"] > 0
    assert result["largest_loss_difference"] < 1e-5

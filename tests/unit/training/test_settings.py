"""Every `HYPHA_*` setting of the executor is checked at start: an unknown value ends the
process in one line naming the setting and what it accepts, exit 2, before the bridge is
touched (the job below fits both generations, so a started executor would ask the bridge)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hypha.accelerate_executor.errors import UsageError
from hypha.accelerate_executor.training.settings import SETTINGS, from_environment
from repo_paths import TESTS

EXECUTOR = [sys.executable, "-m", "hypha.accelerate_executor.training"]
JOB = TESTS / "data" / "job-causal-lm.json"  # fits both generations
SWITCH = "accepted: 1, true, yes, on (on) or 0, false, no, off (off)"
BAD = {
    "HYPHA_PSEUDO_GRADIENT_DTYPE": ("bogus", "accepted: float32, bfloat16"),
    "HYPHA_BRIDGE_GENERATION": ("alpha18", "accepted: auto, alpha17, actions"),
    "HYPHA_MICRO_BATCH_SIZE": ("0", "accepted: a positive number of samples, or auto"),
    "HYPHA_SPECULATIVE_STEP": (
        "maybe",
        "accepted: auto, on, off (also 1, true, yes for on, 0, false, no for off)",
    ),
    "HYPHA_TRUST_REMOTE_CODE": ("please", SWITCH),
    "HYPHA_COMPILE": ("fast", "accepted: auto, on, off"),
    "HYPHA_GRADIENT_CHECKPOINTING": ("sometimes", SWITCH),
    "HYPHA_MODEL_DIR": ("/dev/null/models", "model dir '/dev/null/models': Not a directory"),
}


def test_every_setting_has_a_bad_value_here() -> None:
    assert set(BAD) == {setting.env for setting in SETTINGS}
    assert len({setting.env for setting in SETTINGS}) == len(SETTINGS)


def test_defaults_and_empty_variables_are_accepted() -> None:
    assert from_environment({}) == from_environment({s.env: "" for s in SETTINGS})
    assert (
        from_environment({"HYPHA_PSEUDO_GRADIENT_DTYPE": "BFloat16"})["pseudo_gradient_dtype"]
        == "bfloat16"
    )
    with pytest.raises(UsageError, match="HYPHA_MICRO_BATCH_SIZE='-1' is refused"):
        from_environment({"HYPHA_MICRO_BATCH_SIZE": "-1"})


@pytest.mark.parametrize("variable", sorted(BAD))
def test_an_unknown_value_is_refused_before_the_bridge(variable: str, short_tmp: Path) -> None:
    value, accepted = BAD[variable]
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(short_tmp / "bridge.sock"))
    listener.listen(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPHA_")}
    env[variable] = value
    command = [*EXECUTOR, "--socket", str(short_tmp / "bridge.sock"), "--work-dir", str(short_tmp)]
    result = subprocess.run(
        [*command, "--job", f"@{JOB}"], env=env, capture_output=True, text=True, timeout=60
    )
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):  # nobody connected
        listener.accept()
    listener.close()
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"hypha.accelerate_executor.training: {variable}={value!r} is refused ({accepted})"
    ]


def test_a_flag_overrides_its_variable_and_is_checked_too(short_tmp: Path) -> None:
    from hypha.accelerate_executor.training.main import parse_arguments

    base = ["--socket", "s", "--work-dir", str(short_tmp), "--job", "{}"]
    os.environ["HYPHA_PSEUDO_GRADIENT_DTYPE"] = "bfloat16"
    try:
        assert parse_arguments(base).pseudo_gradient_dtype == "bfloat16"
        flagged = parse_arguments([*base, "--pseudo-gradient-dtype", "float32"])
        assert flagged.pseudo_gradient_dtype == "float32"
        with pytest.raises(UsageError, match="--micro-batch-size: '0' is refused"):
            parse_arguments([*base, "--micro-batch-size", "0"])
    finally:
        del os.environ["HYPHA_PSEUDO_GRADIENT_DTYPE"]

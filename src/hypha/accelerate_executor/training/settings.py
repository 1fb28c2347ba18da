"""The executor's settings: one typed row each, read from a `HYPHA_*` variable or its flag.

Every value is checked when the executor starts, before the bridge is touched: an unknown one
ends the job in one line that names the setting and what it accepts, with exit 2
(`UsageError`). A flag overrides its variable; an empty variable is an unset one.

To add a setting, add a row to SETTINGS (and to docs/configuration.md); `parse_arguments`
in main.py turns each row into its flag and an attribute of the parsed arguments, and
RunSettings is what a loop is given of them.

Torch-free at import, like the rest of the entry's refusals.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.errors import UsageError
from hypha.accelerate_executor.protocol.generation import GENERATIONS

TRUTHY = ("1", "true", "yes", "on")
FALSY = ("0", "false", "no", "off")
PSEUDO_GRADIENT_DTYPES = ("float32", "bfloat16")
COMPILE_CHOICES = ("auto", "on", "off")
# The action protocol's speculative step (actions/speculative.py).
SPECULATIVE_STEP_ENV = "HYPHA_SPECULATIVE_STEP"
SPECULATIVE_STEP_CHOICES = ("auto", "on", "off")


class SettingValueError(ValueError):
    """A value a setting does not accept; the message says what it does accept."""


def choice(*accepted: str) -> Callable[[str], str]:
    """One of `accepted`, in any case."""

    def parse(value: str) -> str:
        picked = value.strip().lower()
        if picked not in accepted:
            raise SettingValueError(f"accepted: {', '.join(accepted)}")
        return picked

    return parse


def switch(value: str) -> bool:
    """On (1, true, yes, on) or off (0, false, no, off), in any case."""
    picked = value.strip().lower()
    if picked in TRUTHY:
        return True
    if picked in FALSY:
        return False
    raise SettingValueError(f"accepted: {', '.join(TRUTHY)} (on) or {', '.join(FALSY)} (off)")


def speculative_step(value: str) -> str:
    """auto, or a switch's on or off (docs/protocol-actions.md, "The speculative step")."""
    picked = value.strip().lower()
    if picked == "auto":
        return picked
    try:
        return "on" if switch(picked) else "off"
    except SettingValueError:
        raise SettingValueError(
            f"accepted: {', '.join(SPECULATIVE_STEP_CHOICES)} "
            f"(also {', '.join(v for v in TRUTHY if v != 'on')} for on, "
            f"{', '.join(v for v in FALSY if v != 'off')} for off)"
        ) from None


def micro_batch_size(value: str) -> int | None:
    """Samples per micro-batch, or `auto` for the whole share, halved on out of memory."""
    if value.strip().lower() == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise SettingValueError("accepted: a positive number of samples, or auto")
    return int(value)


def pseudo_gradient_dtype(value: str) -> str | None:
    """float32 or bfloat16; None (unset) leaves it to the bridge generation (main.py)."""
    return choice(*PSEUDO_GRADIENT_DTYPES)(value) if value else None


def model_dir(value: str) -> Path | None:
    """Where the final model is kept, or nowhere (empty). Made now if missing, so that one
    the executor cannot write is said before the job trains, not after."""
    if not value:
        return None
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingValueError(f"model dir {value!r}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SettingValueError(f"model dir {value!r} is not writable")
    return path


@dataclass(frozen=True)
class Setting:
    """One setting: its variable, its flag (None: the variable only), the attribute of the
    parsed arguments it becomes, what turns its text into a value (raising SettingValueError),
    the text used when neither is given, and the flag's help."""

    env: str
    flag: str | None
    dest: str
    parse: Callable[[str], Any]
    default: str
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "HYPHA_PSEUDO_GRADIENT_DTYPE",
        "--pseudo-gradient-dtype",
        "pseudo_gradient_dtype",
        pseudo_gradient_dtype,
        "",
        "dtype of the pseudo-gradients sent; default: what the generation's own executors "
        "send, bfloat16 on the action protocol, float32 on alpha.17",
    ),
    Setting(
        "HYPHA_BRIDGE_GENERATION",
        "--bridge-generation",
        "bridge_generation",
        choice("auto", *GENERATIONS),
        "auto",
        "the Job Bridge's protocol: alpha17 (statuses), actions (the action protocol of later "
        "Hypha releases) or auto (default: from the job, asking the bridge when the job fits "
        "both)",
    ),
    Setting(
        "HYPHA_MICRO_BATCH_SIZE",
        "--micro-batch-size",
        "micro_batch_size",
        micro_batch_size,
        "auto",
        "samples per micro-batch (default auto: the whole batch, halved on out of memory)",
    ),
    Setting(
        SPECULATIVE_STEP_ENV,
        "--speculative-step",
        "speculative_step",
        speculative_step,
        "auto",
        "action protocol: compute the next batch's gradient while the scheduler's answer is on "
        "its way, step on it only if the answer is execute-batch: on, off (await each answer) "
        "or auto (default: both tried in turns as the job runs, speculating kept where it pays "
        "1.05x)",
    ),
    Setting(
        "HYPHA_TRUST_REMOTE_CODE",
        None,
        "trust_remote_code",
        switch,
        "off",
        "let a model repository's own Python run",
    ),
    Setting(
        "HYPHA_MODEL_DIR",
        "--model-dir",
        "model_dir",
        model_dir,
        "",
        "action protocol: where the final model is written in Hugging Face layout at "
        "terminate, whether or not it was pushed (default: nowhere)",
    ),
    Setting(
        "HYPHA_COMPILE",
        "--compile",
        "compile",
        choice(*COMPILE_CHOICES),
        "auto",
        "torch.compile the model's step: on, off, or auto (default: where it is measured to "
        "pay, a CUDA GPU with Triton and a C compiler); a failed compile falls back to eager",
    ),
    Setting(
        "HYPHA_GRADIENT_CHECKPOINTING",
        "--gradient-checkpointing",
        "gradient_checkpointing",
        switch,
        "off",
        "recompute each transformer block's activations in the backward pass instead of "
        "keeping them (transformers' gradient checkpointing): less memory, a slower step",
    ),
)


def from_environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each setting's value from its variable, or its default; raises UsageError, naming the
    variable, its value and what it accepts, for the first value a setting refuses."""
    env = os.environ if env is None else env
    values = {}
    for setting in SETTINGS:
        text = env.get(setting.env) or setting.default
        try:
            values[setting.dest] = setting.parse(text)
        except SettingValueError as exc:
            raise UsageError(f"{setting.env}={text!r} is refused ({exc})") from None
    return values


def add_flags(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Each setting's flag on `parser`, defaulting to its variable's value (checked now)."""
    values = from_environment(env)
    for setting in SETTINGS:
        if setting.flag is None:
            parser.set_defaults(**{setting.dest: values[setting.dest]})
            continue
        parser.add_argument(
            setting.flag,
            dest=setting.dest,
            type=_flag_type(setting),
            default=values[setting.dest],
            help=f"{setting.help}; also ${setting.env}",
        )


def _flag_type(setting: Setting) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            return setting.parse(value)
        except SettingValueError as exc:
            raise argparse.ArgumentTypeError(f"{value!r} is refused ({exc})") from None

    return parse


@dataclass(frozen=True)
class RunSettings:
    """What a training loop is given: where the job runs, and every setting's value, checked."""

    socket_path: Path
    work_dir: Path
    pseudo_gradient_dtype: str  # resolved: the generation's own where unset
    micro_batch_size: int | None = None
    trust_remote_code: bool = False
    compile: str = "off"
    speculative_step: str = "auto"  # the action protocol's (actions/speculative.py)
    model_dir: Path | None = None  # where the final model is kept at terminate, if anywhere
    gradient_checkpointing: bool = False  # HYPHA_GRADIENT_CHECKPOINTING

"""The speculative step (docs/protocol-actions.md) does the blocking loop's arithmetic: the
executor, as a real process against the stand-in's action-era bridge on a real Unix socket,
answered by a scripted scheduler, sends bit for bit the pseudo-gradients (weight 1: its
weights less the unchanged global ones) that it sends with the speculative step off, both
when every answer trains and when idle, `execute-batch{0}` and the round's own actions make
it drop gradients computed ahead and train their batches later. GPT-2's dropout is on, so
the random draws must be the blocking loop's too: torch seeds itself anew in each process,
so the executor runs here under a fixed seed."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load

from action_bridges import action_bridge, push_once_receiving, zero_update
from hypha.accelerate_executor.platform.launcher.plan import free_port
from hypha.accelerate_executor.protocol.actions.messages import (
    Action,
    ApplyUpdate,
    ExecuteBatch,
    Idle,
    SendUpdate,
    Terminate,
)
from hypha.standin.actions.scheduler import peers
from repo_paths import REPO

REPO = REPO
FSDP_ON_CPU = REPO / "tests" / "sharding" / "executor_on_cpu_as_on_gpus.py"
PS = "12D3KooWJ6MBkbH3o7j2yhhDAF7gRxA4Zm5cpuEUr2Znp1VvNBw3"
SOURCE = peers([PS], "All")


def batches(n: int) -> Action:
    return ExecuteBatch(n)


def idle() -> Action:
    return Idle(time.time())


SEEDED_EXECUTOR = [
    sys.executable,
    "-c",
    "import runpy, torch; torch.manual_seed(0); "
    "runpy.run_module('hypha.accelerate_executor.training', run_name='__main__')",
]
SEND = SendUpdate(SOURCE, 1.0)
APPLY = ApplyUpdate(SOURCE, deadline=0.0)  # answered with a deadline a minute away
TERMINATE = Terminate()

# Every answer trains, bar the round's send and apply (a zero update: theta_global stays
# the initial model, so each send is the weights' drift from it).
ALL_BATCHES = [*[batches(1)] * 5, batches(3), SEND, APPLY, *[batches(1)] * 3, SEND, TERMINATE]
# Answers after a trained batch that train nothing drop the gradient computed ahead.
INTERLEAVED = [
    idle(), batches(1), batches(1), batches(0), batches(2), idle(), batches(1), SEND,
    batches(0), APPLY, batches(1), batches(1), idle(), batches(1), batches(0), batches(0),
    batches(2), batches(1), SEND, TERMINATE,
]  # fmt: skip


# Long enough for `auto` to warm up, try both ways in turns and decide (speculative.py: a
# turn is TURN_CYCLES batch cycles), with answers that train nothing among them.
AUTO_TURNS = [
    *[batches(1)] * 20, batches(0), idle(), *[batches(1)] * 20, SEND, APPLY,
    *[batches(1)] * 6, batches(0), batches(2), *[batches(1)] * 8, SEND, TERMINATE,
]  # fmt: skip


def answering(script: list[Action]) -> Callable[[dict[str, Any]], Action]:
    """The scheduler: each status answered with the script's next action, an apply-update
    with a deadline a minute from then."""
    answers = iter(script)

    def answer(details: dict[str, Any]) -> Action:
        action = next(answers)
        if isinstance(action, ApplyUpdate):
            return replace(action, deadline=time.time() + 60)
        return action

    return answer


def run(
    script: list[Action], speculative: str, assets_dir: Path, work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, torch.Tensor]], str]:
    """The statuses, the pseudo-gradients sent and stdout of one run of the script."""
    assert script.count(APPLY) == 1
    with action_bridge(assets_dir, work, answering(script)) as (job_json, bridge, backend):
        # The bridge is strict: the update comes once the receive opened with the send is.
        push_once_receiving(bridge, backend, zero_update(assets_dir))
        env = {**os.environ, "JOB_JSON": job_json, "HYPHA_SPECULATIVE_STEP": speculative}
        done = subprocess.run(
            [*SEEDED_EXECUTOR, "--socket", str(bridge.socket_path), "--work-dir", str(work)],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return backend.statuses, [load(data) for _, data in backend.sent], done.stdout


def same_tensors(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.mark.slow
@pytest.mark.parametrize("script", [ALL_BATCHES, INTERLEAVED], ids=["all-batches", "interleaved"])
def test_the_speculative_step_trains_bit_for_bit_as_the_blocking_loop(
    script: list[Action], assets_dir: Path, short_tmp: Path
) -> None:
    blocking = run(script, "off", assets_dir, short_tmp / "blocking")
    speculative = run(script, "on", assets_dir, short_tmp / "speculative")
    assert "speculative step off, as asked" in blocking[2]
    assert "speculative step on" in speculative[2]

    statuses, sent, out = speculative
    assert _without_rates(statuses) == _without_rates(blocking[0])
    assert len(sent) == script.count(SEND) == 2
    for ours, theirs in zip(sent, blocking[1], strict=True):
        assert same_tensors(ours, theirs)
    assert any(t.abs().max() > 0 for t in sent[-1].values())  # it did train
    # Each gradient computed ahead was used or dropped: used after every trained batch that
    # was followed by more, dropped where the next answer trained nothing.
    [last] = [line for line in out.splitlines() if line.startswith("terminated")]
    expected = _ahead(script)
    assert f"{expected[0]} gradient(s) computed ahead used, {expected[1]} dropped" in last


@pytest.mark.slow
def test_auto_switching_ways_in_turns_trains_bit_for_bit_as_the_blocking_loop(
    assets_dir: Path, short_tmp: Path
) -> None:
    """`auto` turns speculation off and on mid-job (a gradient computed ahead is stepped or
    dropped across each switch); the arithmetic stays the blocking loop's."""
    blocking = run(AUTO_TURNS, "off", assets_dir, short_tmp / "blocking")
    auto = run(AUTO_TURNS, "auto", assets_dir, short_tmp / "auto")
    assert "speculative step auto: tried in turns" in auto[2]
    assert _without_rates(auto[0]) == _without_rates(blocking[0])
    for ours, theirs in zip(auto[1], blocking[1], strict=True):
        assert same_tensors(ours, theirs)
    [decision] = [line for line in auto[2].splitlines() if "measured in turns" in line]
    assert "batches/s speculating" in decision
    [last] = [line for line in auto[2].splitlines() if line.startswith("terminated")]
    assert "auto: speculated after" in last and "of 1 trial(s)" in last


STATUS_OF = {
    Idle: "idle",
    ExecuteBatch: "batch-completed",
    SendUpdate: "sent-update",
    ApplyUpdate: "applied-update",
}


def status_of(action: Action) -> str:
    """The state the executor answers `action` with: `execute-batch{0}` trains nothing."""
    if isinstance(action, ExecuteBatch) and action.batches == 0:
        return "idle"
    return STATUS_OF[type(action)]


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["on", "auto"])
def test_two_ranks_stay_in_step_through_dropped_and_used_gradients(
    setting: str, assets_dir: Path, short_tmp: Path
) -> None:
    """accelerate launch, 2 CPU ranks (gloo): every rank computes each gradient ahead and
    drops or uses it as rank 0's answer says (DDP's backward all-reduces: a rank out of step
    would hang or fail), through idle, `batches: 0` and the round's actions; under `auto`,
    every rank also switches ways at rank 0's decision, though each timed its own turns."""
    script = INTERLEAVED if setting == "on" else AUTO_TURNS
    work = short_tmp / "work"
    with action_bridge(assets_dir, work, answering(script)) as (job_json, bridge, backend):
        push_once_receiving(bridge, backend, zero_update(assets_dir))
        launcher = [sys.executable, "-m", "hypha.accelerate_executor.platform.launcher"]
        done = subprocess.run(
            [*launcher, "--accelerate-config", "multi-cpu", "--num-processes", "2",
             "--socket", str(bridge.socket_path), "--work-dir", str(work)],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "JOB_JSON": job_json, "HYPHA_SPECULATIVE_STEP": setting},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "over 2 process(es)" in done.stdout and f"speculative step {setting}" in done.stdout
    expected = ["joined"] + [status_of(a) for a in script[:-1]]
    assert [d["state"] for d in backend.statuses] == expected
    [last] = [line for line in done.stdout.splitlines() if "terminated" in line]
    if setting == "on":
        used, dropped = _ahead(INTERLEAVED)
        assert f"{used} gradient(s) computed ahead used, {dropped} dropped" in last
    else:
        assert "of 1 trial(s)" in last
    final = load(backend.sent[-1][1])
    assert all(torch.isfinite(t).all() for t in final.values())
    assert any(t.abs().max() > 0 for t in final.values())


@pytest.mark.slow
def test_under_fsdp_the_speculative_step_sends_the_blocking_loops_pseudo_gradients(
    assets_dir: Path, short_tmp: Path
) -> None:
    """FSDP2 over 2 gloo processes (accelerate's GPU-only gate lifted, as a GPU host lifts it):
    the model sharded, each backward a reduce-scatter on every rank, and gradients computed
    ahead dropped and used through the interleaved script. The pseudo-gradients sent (the
    full weights gathered on rank 0) are the blocking loop's, bit for bit."""
    config = short_tmp / "fsdp.yaml"
    shipped = (REPO / "accelerate-configs" / "fsdp.yaml").read_text()
    config.write_text(
        shipped.replace("use_cpu: false", "use_cpu: true").replace(
            "mixed_precision: bf16", "mixed_precision: 'no'"
        )
    )
    sent = {}
    for setting in ("off", "on"):
        work = short_tmp / setting
        with action_bridge(assets_dir, work, answering(INTERLEAVED)) as (job_json, bridge, backend):
            push_once_receiving(bridge, backend, zero_update(assets_dir))
            done = subprocess.run(
                [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                 "--num_processes", "2", "--main_process_port", str(free_port()),
                 str(FSDP_ON_CPU), "--socket", str(bridge.socket_path), "--work-dir", str(work)],
                capture_output=True, text=True, timeout=600,
                env={**os.environ, "JOB_JSON": job_json, "HYPHA_SPECULATIVE_STEP": setting,
                     "ACCELERATE_USE_CPU": "True", "EXECUTOR_TEST_SEED": "0"},
            )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "distributed type FSDP" in done.stdout, done.stdout[-2000:]
        sent[setting] = [load(data) for _, data in backend.sent]
    assert "speculative step on" in done.stdout
    [last] = [line for line in done.stdout.splitlines() if "terminated" in line]
    used, dropped = _ahead(INTERLEAVED)
    assert f"{used} gradient(s) computed ahead used, {dropped} dropped" in last
    assert len(sent["on"]) == len(sent["off"]) == 2
    for ours, theirs in zip(sent["on"], sent["off"], strict=True):
        assert same_tensors(ours, theirs)
    assert any(t.abs().max() > 0 for t in sent["on"][-1].values())  # it did train


def _without_rates(statuses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The statuses without what depends on the clock (samples/s) and on the allocator
    (the ranks' memory peaks), which no two runs share."""

    def kept(name: str) -> bool:
        return name != "samples_per_second" and not name.startswith("peak_")

    return [
        {**s, "metrics": {k: v for k, v in s["metrics"].items() if kept(k)}}
        if "metrics" in s
        else s
        for s in statuses
    ]


def _ahead(script: list[Action]) -> tuple[int, int]:
    """(used, dropped) gradients computed ahead: one after every trained batch (its status
    is batch-completed; `execute-batch{0}` is answered idle) and every applied update, used
    when the next answer trains."""
    used = dropped = 0
    for before, after in itertools.pairwise(script):
        if isinstance(before, ApplyUpdate) or (
            isinstance(before, ExecuteBatch) and before.batches > 0
        ):
            if isinstance(after, ExecuteBatch) and after.batches > 0:
                used += 1
            else:
                dropped += 1
    return used, dropped


class BatchNormNet(torch.nn.Module):
    """What a forward changes besides the gradient: BatchNorm's statistics, dropout's draws."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 4, 5)
        self.norm = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.3)
        self.head = torch.nn.Linear(4 * 24 * 24, 10)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        hidden = self.drop(torch.relu(self.norm(self.conv(pixel_values))))
        logits = self.head(hidden.flatten(1))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels)}


def test_a_dropped_gradient_leaves_weights_statistics_and_draws_as_they_were() -> None:
    """In one process, in micro-batches of 4 (accumulation, then the sync flag): computing
    ahead and dropping twice, then using, ends where plain steps end, bit for bit."""
    from accelerate import Accelerator

    from hypha.accelerate_executor.training.actions.speculative import SpeculativeStep
    from hypha.accelerate_executor.training.distributed import Ranks
    from hypha.accelerate_executor.training.steps import MicroBatchedStep

    generator = torch.Generator().manual_seed(1)
    batches = [
        {"pixel_values": torch.randn(12, 1, 28, 28, generator=generator),
         "labels": torch.randint(0, 10, (12,), generator=generator)}
        for _ in range(3)
    ]  # fmt: skip

    def trained(speculative: bool) -> BatchNormNet:
        model = BatchNormNet()
        accelerator = Accelerator(cpu=True)
        prepared, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
        names = ["pixel_values", "labels"]
        step = MicroBatchedStep(accelerator, prepared, optimizer, Ranks(accelerator), 12, names, 4)
        data = iter(batches)
        torch.manual_seed(2)
        if not speculative:
            for _ in batches:
                step(next(data))
            return model
        ahead = SpeculativeStep(step, prepared, accelerator.device, lambda: next(data))
        for trains in (False, False, True, True):  # batch 1 dropped twice, then 1 and 2 used
            assert ahead.while_computing(lambda: "answer") == "answer"
            ahead.settle(trains)
            if trains:
                assert ahead.stepped() is not None
        step(ahead.next_batch())  # batch 3, not computed ahead
        ahead.close()
        assert (ahead.used, ahead.dropped) == (2, 2)
        return model

    plain, ahead = trained(False).state_dict(), trained(True).state_dict()
    assert same_tensors(plain, ahead)
    assert int(ahead["norm.num_batches_tracked"]) == 9  # 3 steps of 3 micro-batches


def test_the_setting_is_auto_on_or_off() -> None:
    from hypha.accelerate_executor.training.settings import (
        SettingValueError,
        from_environment,
        speculative_step,
    )

    def chosen(value: str) -> str:
        return str(from_environment({"HYPHA_SPECULATIVE_STEP": value})["speculative_step"])

    assert chosen("") == chosen("AUTO") == "auto"
    assert {chosen(value) for value in ("on", "ON", "1", "true", "yes")} == {"on"}
    assert {chosen(value) for value in ("off", "0", "false", "no")} == {"off"}
    with pytest.raises(SettingValueError, match="accepted: auto, on, off"):
        speculative_step("maybe")


def test_auto_keeps_the_way_measured_faster_and_tries_again() -> None:
    """AutoSpeculation's schedule and decision, fed the figures of cycles."""
    from hypha.accelerate_executor.training.actions.speculative import (
        HOLD_TURNS,
        TRIAL,
        TURN_CYCLES,
        AutoSpeculation,
    )

    shared: list[bool] = []
    said: list[str] = []

    def share(value: bool) -> bool:
        shared.append(value)
        return value

    auto = AutoSpeculation(share, said.append)

    def turns(
        count: int, seconds: dict[bool, float], batches: int = 1, timed: bool = False
    ) -> list[bool]:
        """The ways of `count` turns, each cycle taking `seconds[way]` for `batches`; a
        timed (trial's) turn waits for the device before its last cycle ends."""
        ways = []
        for _ in range(count):
            ways.append(auto.speculate)
            for cycle in range(TURN_CYCLES):
                assert auto.speculate == ways[-1]
                assert auto.closes_turn == (timed and cycle == TURN_CYCLES - 1)
                auto.cycle_ended(seconds[auto.speculate], batches, batch_cycle=True)
                auto.cycle_ended(0.0, 0, batch_cycle=False)  # an idle: no turn's cycle
        return ways

    awaiting_faster = {True: 0.2, False: 0.1}
    assert turns(1, awaiting_faster) == [False]  # warming up, awaiting, untimed
    assert turns(len(TRIAL), awaiting_faster, timed=True) == list(TRIAL)
    assert turns(HOLD_TURNS, awaiting_faster) == [False] * HOLD_TURNS
    assert shared == [False] and len(said) == 1 and "awaiting each answer" in said[0]
    # The host changes (the executor beside this one ended): the next trial sees it.
    speculating_faster = {True: 0.1, False: 0.2}
    assert turns(len(TRIAL), speculating_faster, timed=True) == list(TRIAL)
    assert turns(1, speculating_faster) == [True]
    assert shared == [False, True] and "speculating" in said[1]
    # A trial whose turns trained nothing compares nothing: speculation stays on, unsaid.
    turns(HOLD_TURNS - 1, speculating_faster)
    turns(len(TRIAL), speculating_faster, batches=0, timed=True)
    assert auto.speculate and shared[-1] is True and len(said) == 2
    # Speculating 3 % faster is within a trial's noise: it does not pay (PAYS).
    turns(HOLD_TURNS, speculating_faster)
    turns(len(TRIAL), {True: 0.1, False: 0.103}, timed=True)
    assert not auto.speculate and shared[-1] is False and "awaiting" in said[-1]
    assert auto.tally() == "auto: speculated after 2 of 4 trial(s)"


# The scripts themselves are what the test relies on: both kinds of answer follow a batch.
def test_the_interleaved_script_drops_and_uses() -> None:
    used, dropped = _ahead(INTERLEAVED)
    assert used >= 3 and dropped >= 4
    assert _ahead(ALL_BATCHES) == (8, 2)

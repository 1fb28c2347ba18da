"""Which bridge generation a job is for, asked of the job and of the bridge: the one place that
names both generations. The probe's question and the answers that name each generation are
here; `bridge/` asks it. A job is read by each generation's own types
(alpha17/job.py, actions/job.py), and `parse_any_job_bytes` says when only the bridge can tell
(`Ambiguous`). Retiring a generation is deleting its folders and its row below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import EXIT_OK, JobSpecError, UntrainableJobError
from hypha.accelerate_executor.protocol.actions.job import (
    ActionJob,
    ActionTrainConfig,
    parse_action_job_bytes,
)
from hypha.accelerate_executor.protocol.alpha17.job import (
    Job,
    TrainConfig,
    parse_job_bytes,
    shaped_for_alpha17,
)
from hypha.accelerate_executor.protocol.job import JobModel

Generation = Literal["alpha17", "actions"]
GENERATIONS: tuple[Generation, ...] = get_args(Generation)
AnyJob = Job | ActionJob
AnyTrainConfig = TrainConfig | ActionTrainConfig

# The probe: `POST /action/update` with `{}`, a body no bridge accepts, so nothing reaches a
# scheduler. An action-era bridge refuses it (422, its JSON extractor), an alpha.17 one has
# no such route (404).
PROBE_ROUTE = "/action/update"
PROBE_BODY = b"{}"
PROBE_ANSWERS: dict[int, Generation] = {422: "actions", 404: "alpha17"}


def generation_answering(status: int) -> Generation | None:
    """The generation whose bridge answers the probe with `status`; None for neither."""
    return PROBE_ANSWERS.get(status)


def generation_of(job: AnyJob) -> Generation:
    return "actions" if isinstance(job, ActionJob) else "alpha17"


@dataclass(frozen=True)
class Ambiguous:
    """A job both generations' types accept (a transitional scheduler sent `updates` and
    `results` to an action-era worker, or an alpha.17 job): only the bridge can tell.
    `as_alpha17` and `as_actions` are the job read each way."""

    as_alpha17: Job
    as_actions: ActionJob

    @property
    def job_id(self) -> str:
        return self.as_actions.job_id  # the same either way


def parse_any_job_bytes(data: bytes, generation: Generation | None = None) -> AnyJob | Ambiguous:
    """The job as `generation`'s types read it; with None, as whichever generation's serde
    accepts it (each exactly), or Ambiguous when both do. When neither does, the refusal is
    that of the generation the job is shaped for: alpha.17 where its config names `updates`
    or `results`, the action protocol otherwise."""
    if generation == "alpha17":
        return parse_job_bytes(data)
    if generation == "actions":
        return parse_action_job_bytes(data)
    old = _attempt(parse_job_bytes, data)
    new = _attempt(parse_action_job_bytes, data)
    if isinstance(old, Job) and isinstance(new, ActionJob):
        return Ambiguous(old, new)
    if isinstance(old, Job):
        return old
    if isinstance(new, ActionJob):
        return new
    assert isinstance(old, JobSpecError) and isinstance(new, JobSpecError)
    # Neither trains: an untrainable refusal means that generation's serde accepted it.
    serde_old = isinstance(old, UntrainableJobError)
    serde_new = isinstance(new, UntrainableJobError)
    if serde_old != serde_new:
        raise old if serde_old else new
    raise old if shaped_for_alpha17(data) else new


def why_refused(data: bytes, generation: Generation) -> str:
    """Why `generation`'s types refuse a job the other generation's accept, for the executor's
    generation line: an action-era job simply has no `updates` or `results` for alpha.17;
    any other job is named with the refusal itself (serde's line, which quotes no value of
    the job), e.g. an `updates` that is no peers reference, which the action-era types ignore
    as an unknown field."""
    if generation == "alpha17" and not shaped_for_alpha17(data):
        return "the job has no updates or results"
    refused = _attempt(parse_job_bytes if generation == "alpha17" else parse_action_job_bytes, data)
    if not isinstance(refused, JobSpecError):
        raise ValueError(f"{generation}'s types accept this job")
    who = "alpha.17's" if generation == "alpha17" else "the action protocol's"
    return f"{who} types refuse it: {refused}"


_M = TypeVar("_M", bound=JobModel)


def _attempt(parse: Callable[[bytes], _M], data: bytes) -> _M | JobSpecError:
    try:
        return parse(data)
    except JobSpecError as exc:  # UntrainableJobError among them: serde accepted it
        return exc


def bridge_generation(
    data: bytes, choice: str, probe: Callable[[], Generation | None]
) -> tuple[AnyJob, Generation, str]:
    """The job as the chosen generation (`choice`: one of GENERATIONS, or auto) reads it,
    that generation, and why it was chosen. Only a job both generations accept (an alpha.17
    job, which action-era types read too) is decided by the bridge, asked with `probe` (the
    probe's question above, which reaches no scheduler)."""
    if choice in GENERATIONS:
        forced: Generation = "alpha17" if choice == "alpha17" else "actions"
        job = parse_any_job_bytes(data, forced)
        assert not isinstance(job, Ambiguous)
        return job, forced, "as asked"
    parsed = parse_any_job_bytes(data)
    if isinstance(parsed, Job):
        return parsed, "alpha17", why_refused(data, "actions")
    if isinstance(parsed, ActionJob):
        return parsed, "actions", why_refused(data, "alpha17")
    probed = probe()
    if probed == "actions":
        return parsed.as_actions, "actions", "the job fits both; the bridge serves /action/update"
    if probed == "alpha17":
        return parsed.as_alpha17, "alpha17", "the job fits both; the bridge has no /action/update"
    return parsed.as_alpha17, "alpha17", "the job names updates and results; the bridge did not say"


def json_schema() -> dict[str, Any]:
    return Job.model_json_schema(by_alias=True)


def main(argv: list[str]) -> int:
    """`hypha-accelerate schema`: prints the job spec's JSON Schema."""

    def body() -> int:
        OneLineArgumentParser(prog="hypha-accelerate schema").parse_args(argv)
        print(json.dumps(json_schema(), indent=2))
        return EXIT_OK

    return run_main("hypha-accelerate schema", body)

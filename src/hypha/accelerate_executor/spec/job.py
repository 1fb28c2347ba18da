"""The job spec (JOB_JSON) as the Hypha worker sends it: accepted exactly when Hypha's Rust
types accept it, and refused beyond that only where it cannot train.

One declaration, two steps. The models below restate Hypha's `JobSpec` (crates/messages)
type by type; `serde_json` and `serde` read the text as serde_json and serde do with it
(serde.serde_type derives serde's reading from the models' annotations): that decides
accept or refuse. The same models then give the executor typed access and, by their
constraints, refuse the few jobs serde accepts but no executor could train, each listed in
docs/jobs.md ("the jobs refused beyond serde"). Pure pydantic: the host shim imports this module,
so it must never import torch.

Two generations of the types exist (docs/protocol-actions.md): alpha.17's, whose train config
carries `updates` and `results` and whose data slices are `{dataset, index}`, and the action
protocol's, without either key, with slices `{dataset, hash}` and two more executor classes.
Each is read exactly as its own Rust side reads it (`parse_job_bytes`,
`parse_action_job_bytes`); `parse_any_job_bytes` tells them apart, and says when only the
bridge can (`Ambiguous`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypha.accelerate_executor.entry import OneLineArgumentParser, run_main
from hypha.accelerate_executor.errors import (
    EXIT_OK,
    JobSpecError,
    JsonError,
    UntrainableJobError,
)
from hypha.accelerate_executor.spec.serde import (
    PEER_ID,
    UUID,
    Integer,
    TryFrom,
    struct,
    tagged,
)
from hypha.accelerate_executor.spec.serde_json import read_struct
from hypha.accelerate_executor.spec.tasks import refusal

# serde's kebab-case of upstream's ModelType; `vison2-seq` (sic) is how it spells Vison2Seq,
# and "vision2-seq" is unknown to it.
ModelTask = Literal[
    "auto", "pretraining", "causal-lm", "masked-lm", "mask-generation", "seq2-seq-lm",
    "sequence-classification", "multiple-choice", "next-sentence-prediction",
    "token-classification", "question-answering", "text-encoding", "depth-estimation",
    "image-classification", "video-classification", "keypoint-detection", "keypoint-matching",
    "object-detection", "image-segmentation", "image-to-image", "semantic-segmentation",
    "instance-segmentation", "universal-segmentation", "zero-shot-image-classification",
    "zero-shot-object-detection", "audio-classification", "audio-frame-classification", "ctc",
    "speech-seq2-seq", "audio-x-vector", "text-to-spectrogram", "text-to-waveform",
    "audio-tokenization", "table-question-answering", "document-question-answering",
    "vison2-seq", "image-text-to-text", "time-series-prediction",
]  # fmt: skip
PreprocessorTask = Literal["tokenizer", "feature", "image", "video", "auto"]


# Hypha's types (crates/messages/src/lib.rs), declared once: the annotations say what serde
# accepts (serde.serde_type; a SerdeType in `Annotated` where Python's type says too little),
# the constraints and validators what the executor refuses beyond serde (docs/jobs.md: "the jobs
# refused beyond serde"). Fields stand in upstream's declaration order, which serde reads
# arrays in, and a new field is one line here.


class JobModel(BaseModel):
    # By name too, so that a job can be built in Python (the stand-in's jobs): what is read
    # is serde's output, which holds the wire names only.
    model_config = ConfigDict(frozen=True, extra="ignore", validate_by_name=True)


PeerId = Annotated[str, PEER_ID]


class UriReference(JobModel):
    type: Literal["uri"]
    value: str

    @field_validator("value")
    @classmethod
    def _http_only(cls, value: str) -> str:
        # The bridge fetches http and https only.
        if not value.lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class HuggingFaceReference(JobModel):
    type: Literal["huggingface"]
    # The bridge needs a repository and at least one file to fetch.
    repository: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    filenames: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    # Kept out of repr so a token never reaches a log line by accident.
    token: str | None = Field(default=None, repr=False)


class Strategy(JobModel):
    type: Literal["All", "Random", "One"]


class DatasetSlice(JobModel):
    dataset: str
    index: Annotated[int, Integer("u64")]


class PeersReference(JobModel):
    type: Literal["peers"]
    peers: list[PeerId]
    strategy: Annotated[Strategy, tagged(Strategy)]
    resource: DatasetSlice | None = None


class SchedulerReference(JobModel):
    type: Literal["scheduler"]
    peer: PeerId
    dataset: str


# Upstream's Reference in its variant order, which serde also takes a tag's index in.
REFERENCE = tagged(UriReference, HuggingFaceReference, PeersReference, SchedulerReference)
Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]


def _send_problem(reference: dict[str, Any]) -> str | None:
    return None if reference["type"] == "peers" else "Send can only be created from Peers"


def _receive_problem(reference: dict[str, Any]) -> str | None:
    if reference["type"] != "peers":
        return "Receive can only be created from Peers"
    return None if reference["strategy"]["type"] == "All" else "Receive requires strategy All"


# serde reads every Reference; the bridge fetches uri, huggingface and scheduler references
# only, and a model comes from the first two.
ArtifactReference = Annotated[
    UriReference | HuggingFaceReference, Field(discriminator="type"), REFERENCE
]
DataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference,
    Field(discriminator="type"),
    REFERENCE,
]
# Upstream's Send and Receive: a Reference, then a try_from check.
SendReference = Annotated[PeersReference, TryFrom(REFERENCE, _send_problem)]
ReceiveReference = Annotated[PeersReference, TryFrom(REFERENCE, _receive_problem)]
# A model with no inputs, or a processor given none, cannot run.
InputNames = Annotated[list[str], Field(alias="input-names", min_length=1)]


class ModelSpec(JobModel):
    task: ModelTask
    artifact: ArtifactReference
    input_names: InputNames

    @field_validator("task")
    @classmethod
    def _trainable(cls, task: str) -> str:
        if reason := refusal(task):  # tasks.py: the task table
            raise ValueError(reason)
        return task


class PreprocessorSpec(JobModel):
    task: PreprocessorTask
    artifact: ArtifactReference
    input_names: InputNames


# torch's AdamW refuses these, so the job would fail once its model is loaded.
Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerSpec(JobModel):
    learning_rate: float = Field(alias="learning-rate", ge=0)
    betas: tuple[Beta, Beta] | None = None
    epsilon: Annotated[float, Field(ge=0)] | None = None


Steps = Annotated[int, Integer("i32")]


class CosineWithWarmup(JobModel):
    type: Literal["cosine-with-warmup"]
    warmup_steps: Steps
    training_steps: Steps


class LinearWithWarmup(JobModel):
    type: Literal["linear-with-warmup"]
    warmup_steps: Steps
    training_steps: Steps


class WarmupStableDecay(JobModel):
    type: Literal["wsd"]
    warmup_steps: Steps
    decay_steps: Steps


LrScheduler = Annotated[
    CosineWithWarmup | LinearWithWarmup | WarmupStableDecay, Field(discriminator="type")
]


class TrainConfig(JobModel):
    model: ModelSpec
    data: DataReference
    updates: SendReference
    results: ReceiveReference
    optimizer: OptimizerSpec
    # A batch of nothing trains nothing.
    batch_size: Annotated[int, Integer("u32"), Field(gt=0)]
    preprocessor: PreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class Descriptor(JobModel):
    name: str


class ExecutorSpec(JobModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: TrainConfig


# An aggregate job, declared for serde's sake: the worker's own parameter server runs it.


class AggregateOptimizer(JobModel):
    learning_rate: float = Field(alias="learning-rate")
    momentum: float


class AggregateConfig(JobModel):
    updates: ReceiveReference
    results: SendReference
    optimizer: AggregateOptimizer


class AggregateExecutorSpec(JobModel):
    class_: Literal["aggregate"] = Field(alias="class")
    descriptor: Descriptor
    config: AggregateConfig


class Job(JobModel):
    job_id: Annotated[str, UUID]
    # Read straight from serde_json, not from a buffered enclosing enum: its tag is a string.
    executor: Annotated[ExecutorSpec, tagged(ExecutorSpec, AggregateExecutorSpec, index_tags=False)]

    @property
    def config(self) -> TrainConfig:
        return self.executor.config


JOB_SPEC = struct(Job)


# The action protocol's types (crates/messages/src/lib.rs @3058282936): the train config
# loses `updates` and `results` (targets and sources arrive inside actions), a peers
# reference's slice is named by the hash of its bytes, and the executor enum gains
# `gymnasium` and `rl-trainer`. What stays the same is shared with the classes above.


class HashedSlice(JobModel):
    dataset: str
    hash: Annotated[int, Integer("u64")]


class ActionPeersReference(JobModel):
    type: Literal["peers"]
    peers: list[PeerId]
    strategy: Annotated[Strategy, tagged(Strategy)]
    resource: HashedSlice | None = None


ACTION_REFERENCE = tagged(
    UriReference, HuggingFaceReference, ActionPeersReference, SchedulerReference
)
ActionReference = Annotated[
    UriReference | HuggingFaceReference | ActionPeersReference | SchedulerReference,
    Field(discriminator="type"),
]
ActionArtifactReference = Annotated[
    UriReference | HuggingFaceReference, Field(discriminator="type"), ACTION_REFERENCE
]
ActionDataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference,
    Field(discriminator="type"),
    ACTION_REFERENCE,
]


# Subclasses that only swap the reference type: pydantic keeps an overridden field in its
# place, so serde's field order (arrays) stays upstream's.
class ActionModelSpec(ModelSpec):
    artifact: ActionArtifactReference


class ActionPreprocessorSpec(PreprocessorSpec):
    artifact: ActionArtifactReference


class ActionTrainConfig(JobModel):
    model: ActionModelSpec
    data: ActionDataReference
    optimizer: OptimizerSpec
    batch_size: Annotated[int, Integer("u32"), Field(gt=0)]
    preprocessor: ActionPreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class ActionExecutorSpec(JobModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: ActionTrainConfig


# The other executor classes, declared for serde's sake and refused: a worker runs them with
# other executors (its parameter server, an RL environment).


class ActionAggregateConfig(JobModel):
    optimizer: AggregateOptimizer


class ActionAggregateExecutorSpec(JobModel):
    class_: Literal["aggregate"] = Field(alias="class")
    descriptor: Descriptor
    config: ActionAggregateConfig


class GymnasiumConfig(JobModel):
    model: ActionModelSpec
    environment: str


class GymnasiumExecutorSpec(JobModel):
    class_: Literal["gymnasium"] = Field(alias="class")
    descriptor: Descriptor
    config: GymnasiumConfig


class RlTrainerConfig(JobModel):
    model: ActionModelSpec
    optimizer: OptimizerSpec
    batch_size: Annotated[int, Integer("u32")]
    scheduler: LrScheduler | None = None


class RlTrainerExecutorSpec(JobModel):
    class_: Literal["rl-trainer"] = Field(alias="class")
    descriptor: Descriptor
    config: RlTrainerConfig


class ActionJob(JobModel):
    job_id: Annotated[str, UUID]
    executor: Annotated[
        ActionExecutorSpec,
        tagged(
            ActionExecutorSpec,
            ActionAggregateExecutorSpec,
            GymnasiumExecutorSpec,
            RlTrainerExecutorSpec,
            index_tags=False,
        ),
    ]

    @property
    def config(self) -> ActionTrainConfig:
        return self.executor.config


ACTION_JOB_SPEC = struct(ActionJob)

Generation = Literal["alpha17", "actions"]
GENERATIONS: tuple[Generation, ...] = get_args(Generation)
AnyJob = Job | ActionJob
AnyTrainConfig = TrainConfig | ActionTrainConfig


def generation_of(job: AnyJob) -> Generation:
    return "actions" if isinstance(job, ActionJob) else "alpha17"


def job_bytes(source: str) -> bytes:
    """The job as the worker hands it over: the JSON itself, or `@path` of a file holding
    it. Strings from argv or the environment carry bytes that are not UTF-8 as surrogate
    escapes, which stay invalid here."""
    if not source.startswith("@"):
        return source.encode("utf-8", "surrogatepass")
    try:
        with open(source[1:], "rb") as file:
            return file.read()
    except OSError as exc:
        raise JobSpecError(f"cannot read job file {source[1:]!r}: {exc.strerror}") from None


def _first_error(error: ValidationError) -> str:
    detail = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in detail["loc"]) or "job"
    return f"{where}: {detail['msg'].removeprefix('Value error, ')}"


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobSpecError(f"job is not valid UTF-8 (byte {exc.start})") from None


def _serde(text: str, spec: Any) -> dict[str, Any]:
    """What serde makes of the text as `spec`; JobSpecError with serde's reason if it refuses."""
    try:
        decoded: dict[str, Any] = spec.decode(read_struct(text, frozenset(spec.fields)), ())
    except JsonError as exc:
        raise JobSpecError(f"job is not valid JSON: {exc}") from None
    return decoded


_M = TypeVar("_M", bound=JobModel)

# The executor classes a train executor refuses, with why, once serde has read them.
_OTHER_CLASSES = {
    "aggregate": "'aggregate' jobs belong to the worker's built-in parameter server",
    "gymnasium": "'gymnasium' jobs belong to an RL environment executor",
    "rl-trainer": "'rl-trainer' jobs belong to an RL trainer executor",
}


def _validated(decoded: dict[str, Any], model: type[_M]) -> _M:
    cls = decoded["executor"]["class"]
    if cls in _OTHER_CLASSES:
        raise UntrainableJobError(
            f"executor.class: {_OTHER_CLASSES[cls]}, this executor only runs 'train'"
        )
    try:
        return model.model_validate(decoded)
    except ValidationError as exc:
        raise UntrainableJobError(f"cannot train: {_first_error(exc)}") from None


def parse_job_bytes(data: bytes) -> Job:
    """An alpha.17 job. Raises JobSpecError (UntrainableJobError for a job that serde
    accepts) with one line naming the field and the problem. The message never quotes the
    input's strings: they may hold a token."""
    return _validated(_serde(_text(data), JOB_SPEC), Job)


def parse_action_job_bytes(data: bytes) -> ActionJob:
    """An action-era job, as parse_job_bytes reads an alpha.17 one."""
    return _validated(_serde(_text(data), ACTION_JOB_SPEC), ActionJob)


@dataclass(frozen=True)
class Ambiguous:
    """A job both generations' types accept (a transitional scheduler sent `updates` and
    `results` to an action-era worker, or an alpha.17 job): only the bridge can tell.
    `as_alpha17` and `as_actions` are the job read each way."""

    as_alpha17: Job
    as_actions: ActionJob


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
    raise old if _shaped_for_alpha17(data) else new


def why_refused(data: bytes, generation: Generation) -> str:
    """Why `generation`'s types refuse a job the other generation's accept, for the executor's
    generation line: an action-era job simply has no `updates` or `results` for alpha.17;
    any other job is named with the refusal itself (serde's line, which quotes no value of
    the job), e.g. an `updates` that is no peers reference, which the action-era types ignore
    as an unknown field."""
    if generation == "alpha17" and not _shaped_for_alpha17(data):
        return "the job has no updates or results"
    refused = _attempt(parse_job_bytes if generation == "alpha17" else parse_action_job_bytes, data)
    if not isinstance(refused, JobSpecError):
        raise ValueError(f"{generation}'s types accept this job")
    who = "alpha.17's" if generation == "alpha17" else "the action protocol's"
    return f"{who} types refuse it: {refused}"


def _attempt(parse: Callable[[bytes], _M], data: bytes) -> _M | JobSpecError:
    try:
        return parse(data)
    except JobSpecError as exc:  # UntrainableJobError among them: serde accepted it
        return exc


def _shaped_for_alpha17(data: bytes) -> bool:
    try:
        config = json.loads(data)["executor"]["config"]
    except (ValueError, KeyError, TypeError, RecursionError):  # deep nesting: not alpha.17's
        return False
    return isinstance(config, dict) and ("updates" in config or "results" in config)


def parse_job(source: str) -> Job:
    """Parses JOB_JSON, or `@path` naming a file that holds it."""
    return parse_job_bytes(job_bytes(source))


def json_schema() -> dict[str, Any]:
    return Job.model_json_schema(by_alias=True)


def main(argv: list[str]) -> int:
    """`hypha-accelerate schema`: prints the job spec's JSON Schema."""

    def body() -> int:
        OneLineArgumentParser(prog="hypha-accelerate schema").parse_args(argv)
        print(json.dumps(json_schema(), indent=2))
        return EXIT_OK

    return run_main("hypha-accelerate schema", body)

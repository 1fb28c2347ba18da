"""The job spec (JOB_JSON) as the Hypha worker sends it: accepted exactly when Hypha's Rust
types accept it, and refused beyond that only where it cannot train.

Two steps. `wirejson` and `serde` read the text as serde_json and serde do with Hypha's
`JobSpec` (crates/messages; the declarations below restate its types and attributes):
that decides accept or refuse. The pydantic models then give the executor typed access
and refuse the few jobs serde accepts but no executor could train, each listed in the
README's "Jobs refused beyond serde". Pure pydantic: the host shim imports this module,
so it must never import torch.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hypha.accelerate_executor.errors import (
    JobSpecError,
    JsonError,
    UntrainableJobError,
)
from hypha.accelerate_executor.serde import (
    F64,
    PEER_ID,
    UUID,
    Array,
    Integer,
    Option,
    Str,
    Struct,
    Tagged,
    TryFrom,
    UnitEnum,
    Vec,
)
from hypha.accelerate_executor.tasks import refusal
from hypha.accelerate_executor.wirejson import read_struct

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


# What serde accepts: Hypha's types (crates/messages/src/lib.rs), field by field.

_STRATEGY = Tagged("type", {"All": None, "Random": None, "One": None})
_REFERENCE = Tagged(
    "type",
    {
        "uri": Struct({"value": Str()}),
        "huggingface": Struct(
            {
                "repository": Str(),
                "revision": Option(Str()),
                "filenames": Vec(Str()),
                "token": Option(Str()),
            }
        ),
        "peers": Struct(
            {
                "peers": Vec(PEER_ID),
                "strategy": _STRATEGY,
                "resource": Option(Struct({"dataset": Str(), "index": Integer("u64")})),
            }
        ),
        "scheduler": Struct({"peer": PEER_ID, "dataset": Str()}),
    },
)


def _send_problem(reference: dict[str, Any]) -> str | None:
    return None if reference["type"] == "peers" else "Send can only be created from Peers"


def _receive_problem(reference: dict[str, Any]) -> str | None:
    if reference["type"] != "peers":
        return "Receive can only be created from Peers"
    return None if reference["strategy"]["type"] == "All" else "Receive requires strategy All"


_SEND = TryFrom(_REFERENCE, _send_problem)
_RECEIVE = TryFrom(_REFERENCE, _receive_problem)
_STEPS = Integer("i32")
_SCHEDULER = Tagged(
    "type",
    {
        "cosine-with-warmup": Struct({"warmup_steps": _STEPS, "training_steps": _STEPS}),
        "linear-with-warmup": Struct({"warmup_steps": _STEPS, "training_steps": _STEPS}),
        "wsd": Struct({"warmup_steps": _STEPS, "decay_steps": _STEPS}),
    },
)
_DESCRIPTOR = Struct({"name": Str()})
_TRAIN_CONFIG = Struct(
    {
        "model": Struct(
            {
                "task": UnitEnum(*get_args(ModelTask)),
                "artifact": _REFERENCE,
                "input-names": Vec(Str()),
            }
        ),
        "data": _REFERENCE,
        "updates": _SEND,
        "results": _RECEIVE,
        "optimizer": Struct(
            {"learning-rate": F64(), "betas": Option(Array(F64(), 2)), "epsilon": Option(F64())}
        ),
        "batch_size": Integer("u32"),
        "preprocessor": Option(
            Struct(
                {
                    "task": UnitEnum(*get_args(PreprocessorTask)),
                    "artifact": _REFERENCE,
                    "input-names": Vec(Str()),
                }
            )
        ),
        "scheduler": Option(_SCHEDULER),
    }
)
_AGGREGATE_CONFIG = Struct(
    {
        "updates": _RECEIVE,
        "results": _SEND,
        "optimizer": Struct({"learning-rate": F64(), "momentum": F64()}),
    }
)
# Read straight from serde_json, not from a buffered enclosing enum: its tag is a string.
_EXECUTOR = Tagged(
    "class",
    {
        "train": Struct({"descriptor": _DESCRIPTOR, "config": _TRAIN_CONFIG}),
        "aggregate": Struct({"descriptor": _DESCRIPTOR, "config": _AGGREGATE_CONFIG}),
    },
    index_tags=False,
)
JOB_SPEC = Struct({"job_id": UUID, "executor": _EXECUTOR})


# What the executor reads: typed models of what serde accepted. Their constraints are the
# refusals beyond serde (README: "Jobs refused beyond serde").


class WireModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class UriReference(WireModel):
    type: Literal["uri"]
    value: str

    @field_validator("value")
    @classmethod
    def _http_only(cls, value: str) -> str:
        # The bridge fetches http and https only.
        if not value.lower().startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class HuggingFaceReference(WireModel):
    type: Literal["huggingface"]
    # The bridge needs a repository and at least one file to fetch.
    repository: Annotated[str, Field(min_length=1)]
    revision: str | None = None
    filenames: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    # Kept out of repr so a token never reaches a log line by accident.
    token: str | None = Field(default=None, repr=False)


class Strategy(WireModel):
    type: Literal["All", "One", "Random"]


class DatasetSlice(WireModel):
    dataset: str
    index: int


class PeersReference(WireModel):
    type: Literal["peers"]
    peers: list[str]
    strategy: Strategy
    resource: DatasetSlice | None = None


class SchedulerReference(WireModel):
    type: Literal["scheduler"]
    peer: str
    dataset: str


Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]
# The bridge fetches uri, huggingface and scheduler references; a model comes from the first two.
ArtifactReference = Annotated[UriReference | HuggingFaceReference, Field(discriminator="type")]
DataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference, Field(discriminator="type")
]
# A model with no inputs, or a processor given none, cannot run.
InputNames = Annotated[list[str], Field(alias="input-names", min_length=1)]


class ModelSpec(WireModel):
    task: ModelTask
    artifact: ArtifactReference
    input_names: InputNames

    @field_validator("task")
    @classmethod
    def _trainable(cls, task: str) -> str:
        if reason := refusal(task):  # tasks.py: the task table
            raise ValueError(reason)
        return task


class PreprocessorSpec(WireModel):
    task: PreprocessorTask
    artifact: ArtifactReference
    input_names: InputNames


# torch's AdamW refuses these, so the job would fail once its model is loaded.
Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerSpec(WireModel):
    learning_rate: float = Field(alias="learning-rate", ge=0)
    betas: tuple[Beta, Beta] | None = None
    epsilon: Annotated[float, Field(ge=0)] | None = None


class CosineWithWarmup(WireModel):
    type: Literal["cosine-with-warmup"]
    warmup_steps: int
    training_steps: int


class LinearWithWarmup(WireModel):
    type: Literal["linear-with-warmup"]
    warmup_steps: int
    training_steps: int


class WarmupStableDecay(WireModel):
    type: Literal["wsd"]
    warmup_steps: int
    decay_steps: int


LrScheduler = Annotated[
    CosineWithWarmup | LinearWithWarmup | WarmupStableDecay, Field(discriminator="type")
]


class TrainConfig(WireModel):
    model: ModelSpec
    data: DataReference
    updates: PeersReference
    results: PeersReference
    optimizer: OptimizerSpec
    batch_size: int = Field(gt=0)  # a batch of nothing trains nothing
    preprocessor: PreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class Descriptor(WireModel):
    name: str


class ExecutorSpec(WireModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: TrainConfig


class Job(WireModel):
    job_id: str
    executor: ExecutorSpec

    @property
    def config(self) -> TrainConfig:
        return self.executor.config


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


def parse_job_bytes(data: bytes) -> Job:
    """Raises JobSpecError (UntrainableJobError for a job that serde accepts) with one line
    naming the field and the problem. The message never quotes the input's strings: they
    may hold a token."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobSpecError(f"job is not valid UTF-8 (byte {exc.start})") from None
    try:
        wire = JOB_SPEC.decode(read_struct(text, frozenset(JOB_SPEC.fields)), ())
    except JsonError as exc:
        raise JobSpecError(f"job is not valid JSON: {exc}") from None
    if wire["executor"]["class"] == "aggregate":
        raise UntrainableJobError(
            "executor.class: 'aggregate' jobs belong to the worker's built-in parameter "
            "server, this executor only runs 'train'"
        )
    try:
        return Job.model_validate(wire)
    except ValidationError as exc:
        raise UntrainableJobError(f"cannot train: {_first_error(exc)}") from None


def parse_job(source: str) -> Job:
    """Parses JOB_JSON, or `@path` naming a file that holds it."""
    return parse_job_bytes(job_bytes(source))


def json_schema() -> dict[str, Any]:
    return Job.model_json_schema(by_alias=True)


def main(argv: list[str]) -> int:
    """`hypha-accelerate schema`: prints the job spec's JSON Schema."""
    if argv:
        print("usage: hypha-accelerate schema", file=sys.stderr)
        return 2
    print(json.dumps(json_schema(), indent=2))
    return 0

"""The job spec: every example parses, every malformed job is refused with exit 2 and one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from hypha.accelerate_executor.errors import JobSpecError, UntrainableJobError
from hypha.accelerate_executor.protocol.actions.job import ActionJob
from hypha.accelerate_executor.protocol.alpha17.job import Job, parse_job
from hypha.accelerate_executor.protocol.generation import Ambiguous, parse_any_job_bytes
from hypha.accelerate_executor.protocol.job import ModelTask
from hypha.accelerate_executor.protocol.tasks import TASKS, Trains
from job_examples import ACTION_EXAMPLES, CAUSAL_LM, EXAMPLES, RUST_ACCEPTS, RUST_REFUSES


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 2
    assert ACTION_EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    job = parse_job(path.read_text())
    assert job.executor.class_ == "train"
    # An alpha.17 job is one the action-era types accept too (they ignore unknown keys):
    # only the bridge can tell which worker sent it.
    assert isinstance(parse_any_job_bytes(path.read_bytes()), Ambiguous)
    again = json.loads(job.model_dump_json(by_alias=True, exclude_none=False))
    assert again["executor"]["config"]["model"]["input-names"] == job.config.model.input_names


def test_wire_spelling_round_trips() -> None:
    job = parse_job(json.dumps(CAUSAL_LM))
    wire = job.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert wire == CAUSAL_LM


def test_at_path_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(CAUSAL_LM))
    assert parse_job(f"@{path}").job_id == CAUSAL_LM["job_id"]


@pytest.mark.parametrize("task", get_args(ModelTask))
def test_every_model_task_trains_or_is_refused_in_one_line(task: str) -> None:
    job = json.dumps(with_changes(lambda c: c["model"].__setitem__("task", task)))
    entry = TASKS[task]
    if isinstance(entry, Trains):
        assert parse_job(job).config.model.task == task
        return
    with pytest.raises(UntrainableJobError) as refused:
        parse_job(job)
    assert str(refused.value) == (
        f"cannot train: executor.config.model.task: {task!r} ({entry.auto_class}) is refused: "
        f"{entry.reason}"
    )
    assert "\n" not in str(refused.value)


def test_the_task_table_covers_every_task_and_names_transformers_classes() -> None:
    pytest.importorskip("torch")
    from hypha.accelerate_executor.training.modeling import _transformers_class

    assert list(TASKS) == list(get_args(ModelTask))
    for task, entry in TASKS.items():
        assert _transformers_class(entry.auto_class, task) is not None, task
    assert TASKS["table-question-answering"].auto_class == "AutoModelForQuestionAnswering"


@pytest.mark.parametrize(
    "scheduler",
    [
        {"type": "cosine-with-warmup", "warmup_steps": 1, "training_steps": 10},
        {"type": "linear-with-warmup", "warmup_steps": 0, "training_steps": 10},
        {"type": "wsd", "warmup_steps": 2, "decay_steps": 5},
    ],
)
def test_lr_schedulers(scheduler: dict[str, Any]) -> None:
    job = parse_job(json.dumps(with_changes(lambda c: c.__setitem__("scheduler", scheduler))))
    assert job.config.scheduler is not None and job.config.scheduler.type == scheduler["type"]


def test_optional_fields_may_be_absent_or_null() -> None:
    def strip(config: dict[str, Any]) -> None:
        del config["scheduler"]
        config["optimizer"] = {"learning-rate": 0.001, "betas": None, "epsilon": None}

    job = parse_job(json.dumps(with_changes(strip)))
    assert job.config.scheduler is None and job.config.preprocessor is None


def with_changes(change: Any) -> dict[str, Any]:
    job = copy.deepcopy(CAUSAL_LM)
    change(job["executor"]["config"])
    return job


def set_path(path: str, value: Any) -> Any:
    def change(job: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = job
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value

    return change


DELETE = object()
C = "executor.config"
_PEERS = CAUSAL_LM["executor"]["config"]["results"]
AGGREGATE_EXECUTOR = {
    "class": "aggregate",
    "descriptor": {"name": "parameter-server"},
    "config": {
        "updates": _PEERS,
        "results": _PEERS,
        "optimizer": {"learning-rate": 0.7, "momentum": 0.9},
    },
}
MALFORMED: list[tuple[str, Any, str]] = [
    ("job_id", DELETE, "job_id"),
    ("job_id", 7, "job_id"),
    ("executor", DELETE, "executor"),
    ("executor", AGGREGATE_EXECUTOR, "parameter server"),
    ("executor.class", "infer", "executor.class"),
    ("executor.descriptor", DELETE, "descriptor"),
    (f"{C}.model", DELETE, "model"),
    (f"{C}.model.task", "causal_lm", "model.task"),
    (f"{C}.model.task", "text-generation", "model.task"),
    (f"{C}.model.input-names", DELETE, "input-names"),
    (f"{C}.model.input-names", [], "input-names"),
    (f"{C}.model.artifact", {"type": "peers", "peers": [], "strategy": {"type": "All"}}, "artifact"),
    (f"{C}.model.artifact", {"type": "ftp", "value": "x"}, "artifact"),
    (f"{C}.model.artifact.filenames", [], "filenames"),
    (f"{C}.model.artifact.repository", "", "repository"),
    (f"{C}.model.artifact", {"type": "uri", "value": "file:///etc/passwd"}, "value"),
    (f"{C}.data", DELETE, "data"),
    (f"{C}.data", {"type": "peers", "peers": [], "strategy": {"type": "All"}}, "data"),
    (f"{C}.data.dataset", DELETE, "dataset"),
    (f"{C}.updates", {"type": "scheduler", "peer": "p", "dataset": "d"}, "updates"),
    (f"{C}.updates.strategy", {"type": "Some"}, "strategy"),
    (f"{C}.results.strategy", {"type": "One"}, "strategy All"),
    (f"{C}.results", DELETE, "results"),
    (f"{C}.optimizer", DELETE, "optimizer"),
    (f"{C}.optimizer.learning-rate", DELETE, "learning-rate"),
    (f"{C}.optimizer.learning-rate", "0.1", "learning-rate"),
    (f"{C}.optimizer.learning-rate", -1.0, "learning-rate"),
    (f"{C}.optimizer.betas", [0.9], "betas"),
    (f"{C}.batch_size", 8.0, "batch_size"),
    (f"{C}.batch_size", "8", "batch_size"),
    (f"{C}.batch_size", 0, "batch_size"),
    (f"{C}.batch_size", DELETE, "batch_size"),
    (f"{C}.scheduler", {"type": "cosine", "warmup_steps": 1}, "scheduler"),
    (f"{C}.scheduler", {"type": "wsd", "warmup_steps": 1}, "decay_steps"),
    (f"{C}.preprocessor", {"task": "tokeniser", "artifact": {"type": "uri", "value": "https://h/x"}, "input-names": ["text"]}, "preprocessor.task"),
]  # fmt: skip
NOT_JSON = ["", "{", "[]", "null", '{"job_id": NaN}', "not json at all"]


@pytest.mark.parametrize("name", RUST_ACCEPTS)
def test_what_rust_accepts_is_accepted(name: str) -> None:
    assert parse_job(RUST_ACCEPTS[name]).job_id


@pytest.mark.parametrize("name", RUST_REFUSES)
def test_what_rust_refuses_is_refused(name: str) -> None:
    with pytest.raises(JobSpecError) as refused:
        parse_job(RUST_REFUSES[name])
    assert not isinstance(refused.value, UntrainableJobError)


@pytest.mark.parametrize(
    ("path", "value", "named"), MALFORMED, ids=[f"{p}={v!r}"[:60] for p, v, _ in MALFORMED]
)
def test_malformed_job_names_the_problem(path: str, value: Any, named: str) -> None:
    job = copy.deepcopy(CAUSAL_LM)
    set_path(path, value)(job)
    with pytest.raises(JobSpecError) as refused:
        parse_job(json.dumps(job))
    message = str(refused.value)
    assert "\n" not in message
    assert named in message


@pytest.mark.parametrize("text", NOT_JSON)
def test_not_a_job_object_is_refused(text: str) -> None:
    with pytest.raises(JobSpecError):
        parse_job(text)


def test_token_never_appears_in_errors() -> None:
    job = copy.deepcopy(CAUSAL_LM)
    job["executor"]["config"]["model"]["artifact"]["token"] = "hf_SECRET123"
    job["executor"]["config"]["batch_size"] = "eight"
    with pytest.raises(JobSpecError) as refused:
        parse_job(json.dumps(job))
    assert "hf_SECRET123" not in str(refused.value)
    assert "hf_SECRET123" not in repr(parse_job(json.dumps(CAUSAL_LM | {})).config.model.artifact)


@pytest.mark.parametrize(
    "job_arg",
    [
        "{broken",
        json.dumps({**CAUSAL_LM, "executor": {**CAUSAL_LM["executor"], "class": "aggregate"}}),
        "@/nonexistent/job.json",
    ],
)
def test_executor_exits_2_with_one_line(job_arg: str, tmp_path: Path) -> None:
    """The real entry point, as the worker starts it: exit 2, one line on stderr, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.training",
         "--socket", str(tmp_path / "bridge.sock"), "--work-dir", str(tmp_path), "--job", job_arg],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_missing_arguments_exit_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hypha.accelerate_executor.training", "--socket", "/x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1


def test_json_schema_is_exported() -> None:
    from hypha.accelerate_executor.protocol.generation import json_schema

    schema = json.dumps(json_schema())
    assert "input-names" in schema and "learning-rate" in schema and "batch_size" in schema


@pytest.mark.parametrize("path", ACTION_EXAMPLES, ids=lambda p: p.name)
def test_every_action_era_example_is_an_action_job(path: Path) -> None:
    job = parse_any_job_bytes(path.read_bytes())
    assert isinstance(job, ActionJob)
    assert job.config.model.input_names
    with pytest.raises(JobSpecError, match="missing field `updates`"):
        parse_job(path.read_text())


def _action_job(change: Any = None) -> bytes:
    raw = json.loads(ACTION_EXAMPLES[0].read_text())
    if change is not None:
        change(raw["executor"]["config"])
    return json.dumps(raw).encode()


def test_a_generation_forced_is_read_by_that_generation_alone() -> None:
    alpha17 = json.dumps(CAUSAL_LM).encode()
    assert isinstance(parse_any_job_bytes(alpha17, "alpha17"), Job)
    assert isinstance(parse_any_job_bytes(alpha17, "actions"), ActionJob)
    with pytest.raises(JobSpecError, match="missing field `updates`"):
        parse_any_job_bytes(_action_job(), "alpha17")


def test_a_slice_named_by_index_or_hash_decides_the_generation() -> None:
    peers = {"type": "peers", "peers": [], "strategy": {"type": "One"}}
    by_hash = {**peers, "resource": {"dataset": "d", "hash": 2**64 - 1}}
    by_index = {**peers, "resource": {"dataset": "d", "index": 3}}
    # A model from peers trains under neither generation, but serde reads the slice first.
    with pytest.raises(UntrainableJobError):
        parse_any_job_bytes(_action_job(lambda c: c["model"].__setitem__("artifact", by_hash)))
    with pytest.raises(JobSpecError, match="missing field `hash`"):
        parse_any_job_bytes(_action_job(lambda c: c["model"].__setitem__("artifact", by_index)))


@pytest.mark.parametrize(
    ("cls", "config", "why"),
    [
        ("aggregate", {"optimizer": {"learning-rate": 0.7, "momentum": 0.9}}, "parameter server"),
        ("gymnasium", None, "RL environment"),
        ("rl-trainer", None, "RL trainer"),
    ],
)
def test_the_other_action_era_classes_are_refused_in_one_line(
    cls: str, config: Any, why: str
) -> None:
    raw = json.loads(ACTION_EXAMPLES[0].read_text())
    raw["executor"]["class"] = cls
    if config is not None:
        raw["executor"]["config"] = config
    else:
        raw["executor"]["config"]["environment"] = "CartPole-v1"
    with pytest.raises(UntrainableJobError, match=why):
        parse_any_job_bytes(json.dumps(raw).encode())


@pytest.mark.parametrize(
    ("updates", "why"),
    [
        (None, "the job has no updates or results"),
        ("ps", "alpha.17's types refuse it: executor.config.updates: invalid type: a string, expected an object tagged by `type`"),
        ({"type": "peers", "peers": ["ps"], "strategy": {"type": "All"}}, "alpha.17's types refuse it: executor.config.updates.peers.0: invalid value: a string, expected a libp2p peer id"),
    ],
)  # fmt: skip
def test_the_generation_line_says_why_alpha17_refused_an_action_job(
    updates: Any, why: str, tmp_path: Path
) -> None:
    """A malformed alpha.17 job (its `updates` no peers reference) is rightly run as an
    action-era job, serde ignoring the unknown field; the line says why, not that it has none."""
    from hypha.accelerate_executor.protocol.generation import bridge_generation

    job = _action_job(None if updates is None else lambda c: c.__setitem__("updates", updates))

    def probe() -> None:
        raise AssertionError("only a job both generations accept goes to the bridge")

    parsed, generation, reason = bridge_generation(job, "auto", probe)
    assert isinstance(parsed, ActionJob) and generation == "actions"
    assert reason == why  # serde's line, which quotes no value of the job

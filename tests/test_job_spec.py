"""The job spec: every example parses, every malformed job is refused with exit 2 and one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from hypha.accelerate_executor.errors import JobSpecError
from hypha.accelerate_executor.job import ModelTask, parse_job

EXAMPLES = sorted((Path(__file__).parents[2] / "shared" / "examples").glob("job-*.json"))
if not EXAMPLES:  # a clone without shared/ beside it: the copies in tests/data serve
    EXAMPLES = sorted((Path(__file__).parent / "data").glob("job-*.json"))
CAUSAL_LM = json.loads(next(p for p in EXAMPLES if "causal-lm" in p.name).read_text())


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    job = parse_job(path.read_text())
    assert job.executor.class_ == "train"
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
def test_every_model_task_is_accepted(task: str) -> None:
    job = with_changes(lambda c: c["model"].__setitem__("task", task))
    assert parse_job(json.dumps(job)).config.model.task == task


def test_every_model_task_names_a_transformers_class() -> None:
    pytest.importorskip("torch")
    import transformers

    from hypha.accelerate_executor.modeling import AUTO_MODEL_CLASSES, _transformers_class

    assert set(AUTO_MODEL_CLASSES) == set(get_args(ModelTask))
    for task, name in AUTO_MODEL_CLASSES.items():
        assert _transformers_class(name, task) is not None, task
    assert AUTO_MODEL_CLASSES["causal-lm"] == "AutoModelForCausalLM"
    assert getattr(transformers, AUTO_MODEL_CLASSES["table-question-answering"])


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
MALFORMED: list[tuple[str, Any, str]] = [
    ("job_id", DELETE, "job_id"),
    ("job_id", 7, "job_id"),
    ("executor", DELETE, "executor"),
    ("executor.class", "aggregate", "parameter server"),
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
    (f"{C}.scheduler.warmup_steps", -5, "warmup_steps"),
    (f"{C}.preprocessor", {"task": "tokeniser", "artifact": {"type": "uri", "value": "https://h/x"}, "input-names": ["text"]}, "preprocessor.task"),
]  # fmt: skip
NOT_JSON = ["", "{", "[]", "null", '{"job_id": NaN}', "not json at all"]


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
    from hypha.accelerate_executor.job import json_schema

    schema = json.dumps(json_schema())
    assert "input-names" in schema and "learning-rate" in schema and "batch_size" in schema

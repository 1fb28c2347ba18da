"""parse_job against the real serde: Hypha's job types compiled with serde, serde_json and uuid
(tests/serde_oracle) judge the same bytes. The Rust side's accept or refuse is the truth;
the only difference allowed is a job serde accepts that cannot train, refused as
UntrainableJobError (docs/jobs.md: "the jobs refused beyond serde")."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hypha.accelerate_executor.errors import JobSpecError, UntrainableJobError
from hypha.accelerate_executor.protocol.actions.job import parse_action_job_bytes
from hypha.accelerate_executor.protocol.alpha17.job import parse_job_bytes
from hypha.accelerate_executor.protocol.generation import parse_any_job_bytes
from job_examples import CAUSAL_LM, RUST_ACCEPTS, RUST_REFUSES
from job_mutations import (
    OracleUnavailable,
    build_oracle,
    judge,
    mutations,
    oracle_verdicts,
    summary,
)

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="session")
def oracle() -> Path:
    try:
        return build_oracle()
    except OracleUnavailable as exc:
        pytest.fail(f"serde oracle unavailable: {exc}; deselect these tests with -m 'not oracle'")


def test_generated_mutations_are_decided_as_serde_decides(oracle: Path) -> None:
    judgements = judge(mutations(seed=13, count=3000), oracle, parse_job_bytes)
    print(summary(judgements))
    disagreements = [j for j in judgements if not j.serde_agrees]
    assert not disagreements, "\n".join(
        f"rust {'accepts' if j.rust_accepts else 'refuses'} ({j.rust_reason}), python {j.python} "
        f"({j.python_reason}): {j.case[:200]!r}"
        for j in disagreements[:10]
    )
    # The sample is only worth its figure if both sides and the extra refusals occur in it.
    assert sum(j.rust_accepts for j in judgements) >= 300
    assert any(j.python == "untrainable" for j in judgements)


def test_the_named_cases_are_what_serde_says(oracle: Path) -> None:
    named = {**RUST_ACCEPTS, **RUST_REFUSES}
    verdicts = oracle_verdicts(oracle, [text.encode("utf-8") for text in named.values()])
    wrong = [
        f"{name}: rust {reason or 'accepts'}"
        for (name, (accepts, reason)) in zip(named, verdicts, strict=True)
        if accepts != (name in RUST_ACCEPTS)
    ]
    assert not wrong


def _changed(path: str, value: Any) -> bytes:
    job = copy.deepcopy(CAUSAL_LM)
    *parents, last = path.split(".")
    node = job
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return json.dumps(job).encode()


C = "executor.config"
HF = {
    "type": "huggingface",
    "repository": "r",
    "revision": None,
    "filenames": ["config.json"],
    "token": None,
}
# One job per entry of docs/jobs.md's list: serde accepts each, and none can train.
BEYOND_SERDE = {
    "aggregate job": _changed("executor", {
        "class": "aggregate", "descriptor": {"name": "ps"},
        "config": {"updates": CAUSAL_LM["executor"]["config"]["results"],
                   "results": CAUSAL_LM["executor"]["config"]["updates"],
                   "optimizer": {"learning-rate": 0.7, "momentum": 0.9}},
    }),
    "batch_size 0": _changed(f"{C}.batch_size", 0),
    "negative learning rate": _changed(f"{C}.optimizer.learning-rate", -0.1),
    "negative epsilon": _changed(f"{C}.optimizer.epsilon", -1e-8),
    "beta of 1": _changed(f"{C}.optimizer.betas", [0.9, 1.0]),
    "negative beta": _changed(f"{C}.optimizer.betas", [-0.1, 0.95]),
    "model from peers": _changed(f"{C}.model.artifact", CAUSAL_LM["executor"]["config"]["updates"]),
    "model from the scheduler": _changed(f"{C}.model.artifact", CAUSAL_LM["executor"]["config"]["data"]),
    "data from peers": _changed(f"{C}.data", CAUSAL_LM["executor"]["config"]["updates"]),
    "ftp URI": _changed(f"{C}.model.artifact", {"type": "uri", "value": "ftp://h/model.safetensors"}),
    "empty repository": _changed(f"{C}.model.artifact", {**HF, "repository": ""}),
    "no filenames": _changed(f"{C}.model.artifact", {**HF, "filenames": []}),
    "empty filename": _changed(f"{C}.model.artifact", {**HF, "filenames": [""]}),
    "no input names": _changed(f"{C}.model.input-names", []),
    "no preprocessor input names": _changed(f"{C}.preprocessor", {"task": "tokenizer", "artifact": HF, "input-names": []}),
}  # fmt: skip


def test_each_refusal_beyond_serde_is_one_serde_accepts(oracle: Path) -> None:
    verdicts = oracle_verdicts(oracle, list(BEYOND_SERDE.values()))
    assert [
        name for name, (accepts, _) in zip(BEYOND_SERDE, verdicts, strict=True) if not accepts
    ] == []
    for case in BEYOND_SERDE.values():
        with pytest.raises(UntrainableJobError):
            parse_job_bytes(case)


def test_action_era_mutations_are_decided_as_the_action_era_serde_decides(oracle: Path) -> None:
    """The same seeded mutations (alpha.17 and action-era examples alike) judged by the action
    protocol's types (crates/messages @3058282936) on both sides."""
    judgements = judge(mutations(seed=29, count=3000), oracle, parse_action_job_bytes, "actions")
    print("actions:", summary(judgements))
    lenient = [j for j in judgements if not j.rust_accepts and j.python != "refuse"]
    strict = [j for j in judgements if j.rust_accepts and j.python == "refuse"]
    assert not lenient and not strict, "\n".join(
        f"rust {'accepts' if j.rust_accepts else 'refuses'} ({j.rust_reason}), python {j.python} "
        f"({j.python_reason}): {j.case[:200]!r}"
        for j in (lenient + strict)[:10]
    )
    assert sum(j.rust_accepts for j in judgements) >= 300
    assert any(j.python == "untrainable" for j in judgements)


def test_auto_accepts_exactly_what_either_generation_accepts(oracle: Path) -> None:
    cases = mutations(seed=31, count=1500)
    old = oracle_verdicts(oracle, cases, "alpha17")
    new = oracle_verdicts(oracle, cases, "actions")
    wrong = []
    for case, (old_ok, _), (new_ok, _) in zip(cases, old, new, strict=True):
        try:
            parse_any_job_bytes(case)
            accepted = True
        except UntrainableJobError:
            accepted = True
        except JobSpecError:
            accepted = False
        if accepted != (old_ok or new_ok):
            wrong.append(case[:200])
    assert not wrong, wrong[:5]

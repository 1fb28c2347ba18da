"""The example jobs (tests/data) and the jobs Hypha's Rust types accept and refuse, which the parser and the serde oracle are both held to."""

from __future__ import annotations

import json

from repo_paths import TESTS

EXAMPLES = sorted((TESTS / "data").glob("job-*.json"))
# Jobs as an action-era scheduler sends them (no `updates`, no `results`); the rest are alpha.17's.
ACTION_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("job-actions-")]
EXAMPLES = [p for p in EXAMPLES if p not in ACTION_EXAMPLES]


CAUSAL_LM = json.loads(next(p for p in EXAMPLES if "causal-lm" in p.name).read_text())


# Texts as serde reads them with Hypha's types, each confirmed against the real serde by
# test_job_serde_agreement.py. Each is the causal-lm example with one change.
CAUSAL_LM_TEXT = json.dumps(CAUSAL_LM)


JOB_ID = f'"job_id": "{CAUSAL_LM["job_id"]}"'


PEER = CAUSAL_LM["executor"]["config"]["updates"]["peers"][0]


RUST_ACCEPTS: dict[str, str] = {
    "uppercase UUID": CAUSAL_LM_TEXT.replace(JOB_ID, JOB_ID.upper().replace("JOB_ID", "job_id")),
    "braced UUID": CAUSAL_LM_TEXT.replace(JOB_ID, f'"job_id": "{{{CAUSAL_LM["job_id"]}}}"'),
    "struct as an array of its fields": json.dumps([CAUSAL_LM["job_id"], CAUSAL_LM["executor"]]),
    "reference tag by index": CAUSAL_LM_TEXT.replace('"type": "huggingface"', '"type": 1'),
    "strategy as a one-element array": CAUSAL_LM_TEXT.replace('{"type": "All"}', '["All"]', 1),
    "unit variant in map form": CAUSAL_LM_TEXT.replace('"causal-lm"', '{"causal-lm": null}'),
    "unknown keys and a duplicate one": CAUSAL_LM_TEXT.replace("{", '{"x": 1, "x": [2],', 1),
    "lone surrogate under an unknown top-level key": CAUSAL_LM_TEXT[:-1] + ', "x": "\\ud800"}',
    "1e999 under an unknown top-level key": CAUSAL_LM_TEXT[:-1] + ', "x": 1e999}',
    "nesting past 128 under an unknown top-level key": CAUSAL_LM_TEXT[:-1] + ', "x": ' + "[" * 500 + "]" * 500 + "}",
    "integer learning rate": CAUSAL_LM_TEXT.replace("0.0006", "1"),
    "learning rate 0": CAUSAL_LM_TEXT.replace("0.0006", "0"),
    "negative and zero scheduler steps": CAUSAL_LM_TEXT.replace('"warmup_steps": 20, "training_steps": 400', '"warmup_steps": -5, "training_steps": 0'),
    "sha2-256 peer id": CAUSAL_LM_TEXT.replace(PEER, "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"),
    "no peers to send updates to": CAUSAL_LM_TEXT.replace(f'"peers": ["{PEER}"]', '"peers": []', 1),
}  # fmt: skip


RUST_REFUSES: dict[str, str] = {
    "job_id not a UUID": CAUSAL_LM_TEXT.replace(CAUSAL_LM["job_id"], "not-a-uuid"),
    "job_id with a trailing NUL": CAUSAL_LM_TEXT.replace(CAUSAL_LM["job_id"], CAUSAL_LM["job_id"] + "\\u0000"),
    "snake_case learning_rate": CAUSAL_LM_TEXT.replace('"learning-rate"', '"learning_rate"'),
    "snake_case input_names": CAUSAL_LM_TEXT.replace('"input-names"', '"input_names"'),
    "batch_size 2^32": CAUSAL_LM_TEXT.replace('"batch_size": 8', '"batch_size": 4294967296'),
    "batch_size -0": CAUSAL_LM_TEXT.replace('"batch_size": 8', '"batch_size": -0'),
    "steps past i32": CAUSAL_LM_TEXT.replace('"training_steps": 400', '"training_steps": 2147483648'),
    "learning rate 1e309": CAUSAL_LM_TEXT.replace("0.0006", "1e309"),
    "peer id x": CAUSAL_LM_TEXT.replace(PEER, "x"),
    "empty peer id": CAUSAL_LM_TEXT.replace(PEER, ""),
    "peer id with a character outside base58": CAUSAL_LM_TEXT.replace(PEER, PEER[:-1] + "0"),
    "vision2-seq": CAUSAL_LM_TEXT.replace('"causal-lm"', '"vision2-seq"'),
    "lone surrogate in a known string": CAUSAL_LM_TEXT.replace("markov-512", "markov\\ud800"),
    "1e999 under an unknown key inside the executor": CAUSAL_LM_TEXT.replace('"class"', '"x": 1e999, "class"'),
    "nesting 128 deep": CAUSAL_LM_TEXT.replace('"class"', '"x": ' + "[" * 126 + "]" * 126 + ', "class"'),
    "executor class by index": CAUSAL_LM_TEXT.replace('"class": "train"', '"class": 0'),
    "job_id twice": CAUSAL_LM_TEXT.replace("{", "{" + JOB_ID + ",", 1),
    "results with strategy One": CAUSAL_LM_TEXT.replace('{"type": "All"}', '{"type": "One"}', 2).replace('{"type": "One"}', '{"type": "All"}', 1),
    "byte-order mark": "\ufeff" + CAUSAL_LM_TEXT,
}  # fmt: skip

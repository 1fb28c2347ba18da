"""Seeded mutations of the example jobs, and the serde oracle that judges them.

    python tests/helpers/job_mutations.py [--cases N] [--seed S] [--generation alpha17|actions]

prints how often `parse_job` and the real serde (tests/serde_oracle, built with cargo from
Debian's crate sources) agree. Each case starts from an example job and takes one to three
mutations, each of a kind that parsers tend to get wrong: values of other types and of the
edges of Rust's integer and float ranges, peer ids and UUIDs in every shape, enum spellings,
structs given as arrays, tags given as indices, duplicate and unknown keys, deep nesting,
escapes and bytes that are not UTF-8, truncated and padded texts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repo_paths import TESTS

HERE = TESTS
ORACLE_DIR = HERE / "serde_oracle"
DEBIAN_CRATES = Path("/usr/share/cargo/registry")
# The job specs Hypha's schedulers send, as the repository keeps them.
EXAMPLES = sorted((HERE / "data").glob("job-*.json"))


class OracleUnavailable(Exception):
    pass


def build_oracle() -> Path:
    """The oracle binary, built offline (cargo keeps it up to date in target/)."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not os.access(cargo, os.X_OK):
        raise OracleUnavailable("no cargo on PATH")
    missing = [
        c
        for c in ("serde", "serde_json", "uuid", "bs58")
        if not any(DEBIAN_CRATES.glob(f"{c}-[0-9]*"))
    ]
    if missing:
        raise OracleUnavailable(
            f"no {', '.join(missing)} crate sources in {DEBIAN_CRATES} "
            "(apt-get install librust-serde-dev librust-serde-json-dev librust-uuid-dev librust-bs58-dev)"
        )
    done = subprocess.run(
        [cargo, "build", "--quiet", "--offline"], cwd=ORACLE_DIR, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise OracleUnavailable(f"cargo build failed: {done.stderr.strip()[-2000:]}")
    return ORACLE_DIR / "target" / "debug" / "hypha-job-oracle"


def oracle_verdicts(
    oracle: Path, cases: list[bytes], generation: str = "alpha17"
) -> list[tuple[bool, str]]:
    """(accepted, reason) per case, from one run of the oracle judging with `generation`'s
    types (alpha17 or actions)."""
    lines = "".join(case.hex() + "\n" for case in cases)
    done = subprocess.run(
        [oracle, generation], input=lines, capture_output=True, text=True, check=True
    )
    verdicts = []
    for line in done.stdout.splitlines():
        verdict, _, reason = line.partition("\t")
        if verdict not in ("accept", "refuse"):
            raise RuntimeError(f"oracle: {line}")
        verdicts.append((verdict == "accept", reason))
    if len(verdicts) != len(cases):
        raise RuntimeError(f"oracle answered {len(verdicts)} of {len(cases)} cases")
    return verdicts


# The job tree: dicts, lists and scalars as json.loads gives them, plus Raw (JSON text put in
# as is) and Pairs (an object with duplicate keys).


@dataclass(frozen=True)
class Raw:
    text: str


class Pairs(list[tuple[str, Any]]):
    pass


def dump(value: Any, ascii_only: bool = True) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        value = Pairs(value.items())
    if isinstance(value, Pairs):
        members = (
            f"{json.dumps(k, ensure_ascii=ascii_only)}:{dump(v, ascii_only)}" for k, v in value
        )
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=False)


def _peer_id(code: int, digest: bytes) -> str:
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    data = bytes([code, len(digest)]) + digest
    number, text = int.from_bytes(data, "big"), ""
    while number:
        number, digit = divmod(number, 58)
        text = alphabet[digit] + text
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + text


def _strings(rng: random.Random) -> list[Any]:
    ed25519 = bytes([8, 1, 18, 32]) + rng.randbytes(32)
    valid = _peer_id(0x00, ed25519)
    return [
        "", " ", "x", "not-a-uuid", "0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a10\u0000",
        "0B7F3C52-9A1E-4C55-8D2A-3F6E1B9D4A10", "{0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a10}",
        "urn:uuid:0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a10", "0b7f3c529a1e4c558d2a3f6e1b9d4a10",
        "0b7f3c52-9a1e-4c55-8d2a-3f6e1b9d4a1", "0b7f3c52_9a1e_4c55_8d2a_3f6e1b9d4a10",
        valid, _peer_id(0x12, rng.randbytes(32)), _peer_id(0x12, b""), _peer_id(0x12, rng.randbytes(64)),
        _peer_id(0x12, rng.randbytes(65)), _peer_id(0x00, rng.randbytes(42)), _peer_id(0x00, rng.randbytes(43)),
        _peer_id(0x13, rng.randbytes(32)), valid[:-1], valid + "1", "1" + valid, valid.replace(valid[5], "0", 1),
        "12D3KooWPeer", "Qm", "11", "causal-lm", "vison2-seq", "vision2-seq", "Causal-lm", "causal_lm",
        "tokenizer", "image", "All", "One", "Random", "all", "uri", "huggingface", "peers", "scheduler",
        "train", "aggregate", "cosine-with-warmup", "wsd", "https://h.example/m.safetensors",
        "http://h/x", "HTTPS://H/X", "ftp://h/x", "file:///etc/passwd", "/abs/path", "config.json",
        "caf\u00e9", "\U0001f600", "tab\there", "hf_secretTOKEN", "gymnasium", "rl-trainer",
        "rl_trainer", "environment", "hash",
    ]  # fmt: skip


NUMBERS: list[Any] = [
    0, 1, -1, 7, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
    -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30, 0.5, 8.0, -0.5, 1e-8, 1.0, 0.999, 1e308,
    Raw("1e309"), Raw("-1e309"), Raw("-0"), Raw("-0.0"), Raw("1E2"), Raw("1e-400"), Raw("2e0"),
    Raw("1" + "0" * 400), Raw("0.0000001"), True, False, None,
]  # fmt: skip


def _containers(rng: random.Random) -> list[Any]:
    return [
        [], {}, [0.9], [0.9, 0.95], [0.9, 0.95, 0.1], [0.9, 1.0], [1, 0], ["text"], [""],
        {"type": "All"}, {"type": 0}, {"type": 1}, {"type": 2}, {"type": 3}, {"type": 9},
        {"type": "All", "extra": 1}, ["All"], ["All", 1], {"causal-lm": None}, {"causal-lm": {}},
        {"causal-lm": 1}, {"a": 1, "b": 2},
        {"type": "uri", "value": "https://h/x"}, {"type": "uri", "value": "ftp://h/x"},
        {"type": "scheduler", "peer": _strings(rng)[11], "dataset": "d"},
        {"type": "peers", "peers": [], "strategy": {"type": "One"}},
        {"type": "peers", "peers": [_strings(rng)[11]], "strategy": {"type": "All"}, "resource": {"dataset": "d", "index": 3}},
        {"type": "huggingface", "repository": "r", "filenames": []},
        {"type": "cosine-with-warmup", "warmup_steps": -5, "training_steps": 0},
        {"type": "wsd", "warmup_steps": 1},
        {"type": "peers", "peers": [_strings(rng)[11]], "strategy": {"type": "One"}, "resource": {"dataset": "d", "hash": 2**63}},
        {"type": "peers", "peers": [], "strategy": {"type": "One"}, "resource": {"dataset": "d", "hash": -1}},
        {"dataset": "d", "hash": 7}, {"dataset": "d", "index": 7}, {"dataset": "d", "index": 7, "hash": 7},
        {"learning-rate": 0.7, "momentum": 0.9}, {"optimizer": {"learning-rate": 0.7, "momentum": 0.9}},
    ]  # fmt: skip


Path_ = list[str | int]


def _paths(node: Any, at: Path_) -> list[Path_]:
    found = [at]
    if isinstance(node, Pairs):
        return found
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, [*at, key])
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, [*at, i])
    return found


def _get(node: Any, path: Path_) -> Any:
    for part in path:
        node = node[part]
    return node


def _set(root: Any, path: Path_, value: Any) -> Any:
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


TAGS = {
    "class": ["train", "aggregate", "gymnasium", "rl-trainer"],
    "type": ["uri", "huggingface", "peers", "scheduler"],
    "strategy": ["All", "Random", "One"],
    "scheduler": ["cosine-with-warmup", "linear-with-warmup", "wsd"],
}


def _tree_mutation(rng: random.Random, job: Any) -> Any:
    """One change to the parsed job tree."""
    paths = _paths(job, [])
    path = rng.choice(paths)
    node = _get(job, path)
    kind = rng.randrange(12)
    if kind <= 2:  # another value
        pool = [_strings(rng), NUMBERS, _containers(rng)][kind]
        return _set(job, path, rng.choice(pool))
    if kind == 3 and path:  # drop it
        parent = _get(job, path[:-1])
        del parent[path[-1]]
        return job
    if kind == 4 and isinstance(node, dict):  # an unknown key, a snake_case twin, the other
        # generation's keys
        key = rng.choice(
            ["extra", "input_names", "learning_rate", "batchSize", "type", "class", "value",
             "updates", "results", "environment", "hash"]
        )  # fmt: skip
        node[key] = rng.choice(_strings(rng) + NUMBERS + _containers(rng))
        return job
    if kind == 5 and isinstance(node, dict) and node:  # a key given twice
        key = rng.choice(list(node))
        pairs = Pairs(node.items())
        pairs.insert(rng.randrange(len(pairs) + 1), (key, rng.choice([node[key], *NUMBERS[:4]])))
        return _set(job, path, pairs)
    if kind == 6 and isinstance(node, dict):  # the struct as an array of its fields
        values = list(node.values())
        if rng.random() < 0.3:
            values = values[:-1] if rng.random() < 0.5 else [*values, None]
        return _set(job, path, values)
    if kind == 7 and isinstance(node, str):  # a tag or variant by index, or in map form
        for names in TAGS.values():
            if node in names:
                return _set(
                    job, path, names.index(node) if rng.random() < 0.7 else rng.randrange(5)
                )
        return _set(job, path, {node: rng.choice([None, {}, 0, []])})
    if kind == 8:  # deep nesting, here or under an unknown top-level key
        depth = rng.choice([10, 100, 120, 124, 125, 126, 127, 128, 200, 3000])
        nested = Raw("[" * depth + "1" + "]" * depth)
        if rng.random() < 0.5 and isinstance(job, dict):
            job["deep"] = nested
            return job
        return _set(job, path, nested)
    if kind == 9 and isinstance(node, str):  # escapes serde reads its own way
        escape = rng.choice(
            [
                "\\ud800",
                "\\udc00",
                "\\ud83d\\ude00",
                "\\ud800\\u0041",
                "\\u00e9",
                "\\x41",
                "\\/",
                "\t",
            ]
        )
        cut = rng.randrange(len(node) + 1)
        return _set(
            job, path, Raw(json.dumps(node[:cut])[:-1] + escape + json.dumps(node[cut:])[1:])
        )
    if kind == 10 and isinstance(job, dict):  # values serde reads only where the type asks for them
        job[rng.choice(["note", "x"])] = rng.choice(
            [Raw("1e999"), Raw('"\\ud800"'), Raw("-0"), 2**70]
        )
        return job
    if kind == 11 and isinstance(node, dict) and node:  # the keys in another order
        items = list(node.items())
        rng.shuffle(items)
        return _set(job, path, dict(items))
    return _set(job, path, rng.choice(NUMBERS))


def _byte_mutation(rng: random.Random, data: bytes) -> bytes:
    """One change to the serialized bytes."""
    at = rng.randrange(len(data) + 1)
    kind = rng.randrange(6)
    if kind == 0:
        return data[:at]
    if kind == 1:
        return data[:at] + data[at + 1 :]
    if kind == 2:
        bad = [
            b"\xff",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\x00",
            b"\x80",
            b"\xe2\x82",
            b"\xf4\x90\x80\x80",
        ]
        return data[:at] + rng.choice(bad) + data[at:]
    if kind == 3:
        return data + rng.choice([b" ", b"\n", b"x", b"{}", b",", b"\xef\xbb\xbf"])
    if kind == 4:
        return rng.choice([b"\xef\xbb\xbf", b" \t\r\n", b"["]) + data
    return data[:at] + bytes([rng.randrange(32, 127)]) + data[at:]


def mutations(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    originals = [json.loads(p.read_text()) for p in EXAMPLES]
    cases = [p.read_bytes() for p in EXAMPLES]
    while len(cases) < count:
        job = json.loads(json.dumps(rng.choice(originals)))
        for _ in range(rng.choice([1, 1, 2, 3])):
            job = _tree_mutation(rng, job)
        data = dump(job, ascii_only=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        if rng.random() < 0.15:
            data = _byte_mutation(rng, data)
        cases.append(data)
    return cases


@dataclass(frozen=True)
class Judgement:
    case: bytes
    rust_accepts: bool
    rust_reason: str
    python: str  # "accept", "refuse" (serde's refusal) or "untrainable" (beyond serde)
    python_reason: str

    @property
    def serde_agrees(self) -> bool:
        """Python's serde step decides as Rust does (beyond-serde refusals passed it)."""
        return self.rust_accepts == (self.python != "refuse")


def judge(
    cases: list[bytes],
    oracle: Path,
    parse: Callable[[bytes], Any],
    generation: str = "alpha17",
) -> list[Judgement]:
    from hypha.accelerate_executor.errors import JobSpecError, UntrainableJobError

    judgements = []
    verdicts = oracle_verdicts(oracle, cases, generation)
    for case, (accepts, reason) in zip(cases, verdicts, strict=True):
        try:
            parse(case)
            python, why = "accept", ""
        except UntrainableJobError as exc:
            python, why = "untrainable", str(exc)
        except JobSpecError as exc:
            python, why = "refuse", str(exc)
        judgements.append(Judgement(case, accepts, reason, python, why))
    return judgements


def summary(judgements: list[Judgement]) -> str:
    total = len(judgements)
    rust_accepts = sum(j.rust_accepts for j in judgements)
    agree = sum(j.serde_agrees for j in judgements)
    beyond = sum(j.python == "untrainable" for j in judgements)
    return (
        f"{total} cases, Rust accepts {rust_accepts} and refuses {total - rust_accepts}; "
        f"accept/refuse agreement {agree}/{total} ({100 * agree / total:.2f} %); "
        f"of Rust's accepts, {beyond} refused deliberately (docs/jobs.md: the jobs refused beyond serde)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description="parse_job against the real serde on seeded mutations")
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--generation", choices=("alpha17", "actions"), default="alpha17")
    args = p.parse_args()
    from hypha.accelerate_executor.protocol.actions.job import parse_action_job_bytes
    from hypha.accelerate_executor.protocol.alpha17.job import parse_job_bytes

    parse = parse_job_bytes if args.generation == "alpha17" else parse_action_job_bytes
    judgements = judge(mutations(args.seed, args.cases), build_oracle(), parse, args.generation)
    for j in judgements:
        if not j.serde_agrees:
            print(
                f"DISAGREE rust={j.rust_accepts} ({j.rust_reason}) python={j.python} ({j.python_reason}): {j.case[:300]!r}"
            )
    print(summary(judgements))
    return 0 if all(j.serde_agrees for j in judgements) else 1


if __name__ == "__main__":
    sys.exit(main())

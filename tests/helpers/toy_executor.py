"""A minimal DiLoCo executor that speaks the bridge protocol, to drive the local stand-in in tests.

Not the project's executor (that is hypha.accelerate_executor.training): just enough of
one to prove the stand-in end to end without it. Usage, as a worker spawns it:
    python toy_executor.py --socket S --work-dir W [--job JSON|@path]  (default: $JOB_JSON)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save_file
from transformers import AutoModelForCausalLM


class Bridge(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float | None = 60.0) -> None:
        super().__init__("hypha", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)

    def call(self, route: str, payload: Any) -> Any:
        self.request(
            "POST",
            route,
            body=json.dumps(payload, allow_nan=False),
            headers={"Content-Type": "application/json"},
        )
        response = self.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"toy executor: {route} answered {response.status}: {body.decode()}")
        return json.loads(body) if body else None


def follow(socket_path: str, results: Any, events: queue.Queue[dict[str, Any]]) -> None:
    stream = Bridge(socket_path, timeout=None)
    stream.request(
        "POST",
        "/resources/receive",
        body=json.dumps({"resource": results}),
        headers={"Content-Type": "application/json"},
    )
    for line in stream.getresponse():
        if line.startswith(b"data:"):
            events.put(json.loads(line[len(b"data:") :]))


def batches(
    bridge: Bridge, work_dir: Path, data: Any, batch_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        [entry] = bridge.call("/resources/fetch", data)
        # Read whole, not mapped: the bridge may rewrite the file in place later.
        tensors = load((work_dir / entry["path"]).read_bytes())
        samples = next(iter(tensors.values())).shape[0]
        for start in range(0, samples - batch_size + 1, batch_size):
            yield {name: tensor[start : start + batch_size] for name, tensor in tensors.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    # The worker exports the job as JOB_JSON; --job is for hand use.
    parser.add_argument("--job", default=os.environ.get("JOB_JSON"))
    args = parser.parse_args()
    if not args.job:
        parser.error("the job is missing: give --job, or set JOB_JSON")
    job = json.loads(Path(args.job[1:]).read_text() if args.job.startswith("@") else args.job)
    config = job["executor"]["config"]
    torch.set_num_threads(1)
    torch.manual_seed(0)

    events: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(
        target=follow, args=(args.socket, config["results"], events), daemon=True
    ).start()
    bridge = Bridge(args.socket)
    bridge.call("/resources/fetch", config["model"]["artifact"])
    model = AutoModelForCausalLM.from_pretrained(args.work_dir / "artifacts")
    optimizer_spec = config["optimizer"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=optimizer_spec["learning-rate"], betas=tuple(optimizer_spec["betas"])
    )
    global_state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    round_, losses, remaining = 0, [], None
    for batch in batches(bridge, args.work_dir, config["data"], config["batch_size"]):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        answer = bridge.call("/status/send", {"status": {"batch_size": config["batch_size"]}})
        if answer["type"] == "ScheduleUpdate":
            remaining = answer["counter"]
        elif remaining is not None:
            remaining -= 1
        if remaining != 0:
            continue
        state = model.state_dict()
        name = f"pseudo-gradient-{round_}.safetensors"
        save_file(
            {key: state[key] - global_state[key] for key in global_state}, str(args.work_dir / name)
        )
        bridge.call("/resources/send", {"resource": config["updates"], "path": name})
        mean_loss = sum(losses) / len(losses)
        bridge.call("/status/send", {"metrics": {"round": round_, "metrics": {"loss": mean_loss}}})
        bridge.call("/status/send", "update")
        update = load((args.work_dir / events.get(timeout=300)["path"]).read_bytes())
        global_state = {key: value + update[key] for key, value in global_state.items()}
        model.load_state_dict(global_state)
        answer = bridge.call("/status/send", "update-received")
        print(f"round {round_}: loss {mean_loss:.3f}", flush=True)
        if answer["type"] == "Done":
            return 0
        round_, losses, remaining = round_ + 1, [], None
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The parameter server's true mean and Nesterov step, end to end through three real bridges."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hypha.standin.parameter_server.server import NesterovOuterOptimizer, true_mean

# Pseudo-gradients of three workers over two rounds. Round 1's mean of "w" is [3, 5]:
# pairwise averaging ((1+3)/2 + 5)/2 would give 3.5, so the true mean is what is tested.
ROUND_1 = [
    {"w": [1.0, 2.0], "b": [2.0], "only_w1": [9.0]},
    {"w": [3.0, 4.0], "b": [4.0]},
    {"w": [5.0, 9.0], "b": [6.0]},
]
ROUND_2 = [
    {"w": [0.0, 0.0], "b": [1.0]},
    {"w": [0.0, 0.0], "b": [1.0]},
    {"w": [3.0, 3.0], "b": [1.0]},
]
# By hand, lr 0.7, mu 0.9. Round 1: m = g; u = 0.7 * (0.9 * m + g) = 1.33 * g.
#   w: g = [3, 5] -> u = [3.99, 6.65];  b: g = [4] -> u = [5.32]
# Round 2: m = 0.9 * m1 + g2; u = 0.7 * (0.9 * m + g2).
#   w: g = [1, 1], m = [3.7, 5.5] -> u = 0.7 * ([3.33, 4.95] + 1) = [3.031, 4.165]
#   b: g = [1], m = [4.6] -> u = 0.7 * (4.14 + 1) = [3.598]
EXPECTED = [
    {"w": [3.99, 6.65], "b": [5.32]},
    {"w": [3.031, 4.165], "b": [3.598]},
]


def as_tensors(values: dict[str, list[float]]) -> dict[str, torch.Tensor]:
    # "b" travels as bf16: the update must come back in the pseudo-gradient's dtype.
    return {
        name: torch.tensor(v, dtype=torch.bfloat16 if name == "b" else torch.float32)
        for name, v in values.items()
    }


def test_true_mean_and_nesterov_over_three_workers_and_two_rounds(
    make_coordinator, make_bridge, connect, receive
):
    coordinator = make_coordinator(workers=3, outer_learning_rate=0.7, outer_momentum=0.9)
    bridges = [make_bridge(coordinator, f"w{index + 1}") for index in range(3)]
    streams = [
        receive(bridge.socket_path, {"resource": job["executor"]["config"]["results"]})[2]
        for bridge, job in bridges
    ]
    for round_, (gradients, expected) in enumerate(
        [(ROUND_1, EXPECTED[0]), (ROUND_2, EXPECTED[1])]
    ):
        for (bridge, job), values in zip(bridges, gradients, strict=True):
            name = f"pseudo-gradient-{round_}.safetensors"
            save_file(as_tensors(values), str(bridge.work_dir / name))
            body = {"resource": job["executor"]["config"]["updates"], "path": name}
            assert connect(bridge.socket_path).post("/resources/send", body)[0] == 200
        for (bridge, _), stream in zip(bridges, streams, strict=True):
            event = stream.next_event()
            assert event["from_peer"] == coordinator.parameter_server_peer
            update = load_file(bridge.work_dir / event["path"])
            assert set(update) == {"w", "b"}  # "only_w1" is not in every file
            assert update["w"].dtype == torch.float32 and update["b"].dtype == torch.bfloat16
            torch.testing.assert_close(update["w"], torch.tensor(expected["w"]), rtol=0, atol=1e-5)
            # bf16 keeps 8 bits of mantissa: 5.32 arrives as 5.3125.
            torch.testing.assert_close(
                update["b"].float(), torch.tensor(expected["b"]), rtol=0, atol=0.02
            )
    assert [entry["workers"] for entry in coordinator.aggregation.rounds] == [
        ["w1", "w2", "w3"]
    ] * 2
    assert coordinator.aggregation.rounds[0]["skipped_tensors"] == ["only_w1 (not in every file)"]


def test_a_worker_that_exits_no_longer_holds_up_the_round(
    make_coordinator, make_bridge, connect, receive
):
    coordinator = make_coordinator(workers=2)
    (first, job), (_, second_job) = (
        make_bridge(coordinator, "w1"),
        make_bridge(coordinator, "w2"),
    )
    _, _, stream = receive(first.socket_path, {"resource": job["executor"]["config"]["results"]})
    save_file({"w": torch.tensor([2.0])}, str(first.work_dir / "g.safetensors"))
    connect(first.socket_path).post(
        "/resources/send",
        {"resource": job["executor"]["config"]["updates"], "path": "g.safetensors"},
    )
    coordinator.report_exit(second_job["job_id"], 1, [])
    event = stream.next_event()
    update = load_file(first.work_dir / event["path"])
    torch.testing.assert_close(update["w"], torch.tensor([0.7 * 1.9 * 2.0]))


def test_mismatched_shapes_are_left_out():
    mean, skipped = true_mean(
        [{"a": torch.ones(2), "c": torch.ones(1)}, {"a": torch.ones(3), "c": torch.ones(1)}]
    )
    assert set(mean) == {"c"} and skipped == ["a (shapes differ)"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_first_round_momentum_is_the_gradient(dtype):
    optimizer = NesterovOuterOptimizer(learning_rate=1.0, momentum=0.5)
    update, _ = optimizer.step(
        [{"x": torch.tensor([2.0], dtype=dtype)}, {"x": torch.tensor([4.0], dtype=dtype)}]
    )
    # g = 3, m = g = 3, u = 1.0 * (0.5 * 3 + 3) = 4.5
    assert update["x"].dtype == dtype
    assert update["x"].float().item() == pytest.approx(4.5)

"""Bridge conformance (docs/protocol.md sections 2 and 7) against a real Unix socket and coordinator."""

from __future__ import annotations

import json
import os
import socket
import stat
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from hypha.standin.jobs import new_peer_id

# A peer id as libp2p parses it (the worker refuses any other with 422), but nobody's.
NOBODY = new_peer_id()
PEERS_ALL = {"type": "peers", "peers": [], "strategy": {"type": "All"}, "resource": None}


def mode(path: os.PathLike[str] | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=["tcp", "in-process"])
def bridge(request, make_coordinator, make_bridge):
    """The bridge must answer alike whichever way it reaches the coordinator."""
    coordinator = make_coordinator(workers=1, steps_per_round=4, clock=lambda: 0.0)
    bridge, job = make_bridge(coordinator, backend=request.param, keepalive_s=0.2)
    return coordinator, bridge, job


def test_socket_is_0600_and_any_host_works(bridge, connect):
    _, server, _ = bridge
    assert stat.S_ISSOCK(os.stat(server.socket_path).st_mode)
    assert mode(server.socket_path) == 0o600
    connection = connect(server.socket_path)
    connection.request("GET", "/openapi.json", headers={"Host": "anything.example"})
    response = connection.getresponse()
    assert response.status == 200
    document = json.loads(response.read())
    assert {"/resources/fetch", "/resources/send", "/resources/receive", "/status/send"} <= set(
        document["paths"]
    )
    # Keep-alive: a second request on the same connection.
    assert connection.post_json("/status/send", {"status": {"batch_size": 8}}) == (
        200,
        {"type": "Continue"},
    )


def test_fetch_huggingface_keeps_names_and_subfolders(bridge, connect):
    _, server, job = bridge
    reference = dict(job["executor"]["config"]["model"]["artifact"])
    reference["filenames"] = ["config.json", "tokenizer/tokenizer.json", "model.safetensors"]
    status, files = connect(server.socket_path).post_json("/resources/fetch", reference)
    assert status == 200
    assert files == [
        {"path": "artifacts/config.json", "size": 22},
        {"path": "artifacts/tokenizer/tokenizer.json", "size": 18},
        {"path": "artifacts/model.safetensors", "size": 5000},
    ]
    for entry in files:
        path = server.work_dir / entry["path"]
        assert path.stat().st_size == entry["size"]
        assert mode(path) == 0o600
    assert (
        server.work_dir / "artifacts/tokenizer/tokenizer.json"
    ).read_text() == '{"version": "1.0"}'


def test_fetch_uri_is_named_after_the_last_segment(bridge, connect):
    _, server, _ = bridge
    reference = {"type": "uri", "value": "https://models.example.org/some/path/weights.bin"}
    status, files = connect(server.socket_path).post_json("/resources/fetch", reference)
    assert (status, files) == (200, [{"path": "artifacts/weights.bin", "size": 300}])


def test_fetch_scheduler_gives_distinct_slices_named_by_index(
    make_coordinator, make_bridge, connect
):
    coordinator = make_coordinator(workers=2)
    first, job = make_bridge(coordinator, "w1")
    second, _ = make_bridge(coordinator, "w2")
    data = job["executor"]["config"]["data"]
    seen = []
    for server in (first, second, first, second, first):
        status, files = connect(server.socket_path).post_json("/resources/fetch", data)
        assert status == 200
        [entry] = files
        assert entry["path"].startswith("artifacts/") and "." not in entry["path"]
        seen.append(int(entry["path"].removeprefix("artifacts/")))
        tensors = load_file(server.work_dir / entry["path"])
        assert tensors["input_ids"].dtype == torch.int64
    # Four slices: distinct until they run out; on the next pass each worker gets its own.
    assert seen == [0, 1, 2, 3, 0]


def test_a_slice_fetched_again_is_rewritten_in_place(bridge, connect):
    _, server, job = bridge
    connection = connect(server.socket_path)
    data = job["executor"]["config"]["data"]
    paths = [connection.post_json("/resources/fetch", data)[1][0]["path"] for _ in range(4)]
    assert paths == ["artifacts/0", "artifacts/1", "artifacts/2", "artifacts/3"]
    first = server.work_dir / "artifacts" / "0"
    size = first.stat().st_size
    # A reader that still holds the file: a hard link to it, emptied.
    held = server.work_dir / "held"
    os.link(first, held)
    os.truncate(held, 0)
    # The only worker gets slice 0 again: File::create truncates and writes that same
    # inode, so the holder sees the rewrite (a write-and-rename would leave it empty).
    assert connection.post_json("/resources/fetch", data)[1] == [
        {"path": "artifacts/0", "size": size}
    ]
    assert held.stat().st_size == size and os.path.samefile(held, first)
    assert mode(first) == 0o600


@pytest.mark.parametrize(
    ("reference", "error", "fragment"),
    [
        (PEERS_ALL, "invalid_request", "not peers"),
        ({"type": "uri", "value": "ftp://host/file.bin"}, "invalid_request", "http"),
        ({"type": "uri", "value": "https://host/dir/"}, "invalid_request", "file name"),
        (
            {"type": "huggingface", "repository": "", "filenames": ["a"]},
            "invalid_request",
            "repository",
        ),
        (
            {"type": "huggingface", "repository": "local/tiny-gpt2", "filenames": []},
            "invalid_request",
            "filenames",
        ),
        (
            {"type": "huggingface", "repository": "local/tiny-gpt2", "filenames": ["../x"]},
            "invalid_request",
            "..",
        ),
        (
            {"type": "huggingface", "repository": "local/tiny-gpt2", "filenames": ["/etc/passwd"]},
            "invalid_request",
            "absolute",
        ),
        (
            {"type": "huggingface", "repository": "local/tiny-gpt2", "filenames": ["nope.json"]},
            "connector_error",
            "nope.json",
        ),
        ({"type": "uri", "value": "https://host/missing.bin"}, "connector_error", "missing.bin"),
        (
            {"type": "scheduler", "peer": NOBODY, "dataset": "toy"},
            "network_error",
            NOBODY,
        ),
    ],
)
def test_fetch_errors_are_json(bridge, connect, reference, error, fragment):
    _, server, _ = bridge
    status, content_type, body = connect(server.socket_path).post("/resources/fetch", reference)
    assert status == (400 if error == "invalid_request" else 500)
    assert content_type == "application/json"
    answer = json.loads(body)
    assert answer["error"] == error
    assert fragment in answer["detail"]


def test_fetch_unknown_dataset_is_a_connector_error(bridge, connect):
    _, server, job = bridge
    reference = {**job["executor"]["config"]["data"], "dataset": "other"}
    status, answer = connect(server.socket_path).post_json("/resources/fetch", reference)
    assert status == 500 and answer["error"] == "connector_error"


def test_coordinator_gone_is_a_network_error(make_coordinator, make_bridge, connect):
    coordinator = make_coordinator(workers=1)
    server, _ = make_bridge(coordinator)
    connection = connect(server.socket_path)
    batch = {"status": {"batch_size": 8}}
    # The bridge keeps its connection to the coordinator alive: stopping cuts it.
    assert connection.post_json("/status/send", batch) == (200, {"type": "Continue"})
    coordinator.stop()
    status, answer = connection.post_json("/status/send", batch)
    assert status == 500 and answer["error"] == "network_error"


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_non_json_content_type_is_a_plain_415(bridge, connect, content_type):
    _, server, _ = bridge
    status, answer_type, body = connect(server.socket_path).post(
        "/status/send", b'"update"', content_type
    )
    assert status == 415
    assert answer_type.startswith("text/plain")
    assert b"application/json" in body


def test_json_content_type_with_charset_is_accepted(bridge, connect):
    _, server, _ = bridge
    status, _, body = connect(server.socket_path).post(
        "/status/send", {"status": {"batch_size": 1}}, "application/json; charset=utf-8"
    )
    assert (status, json.loads(body)) == (200, {"type": "Continue"})


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b'{"metrics": {"round": 1, "metrics": {"loss": NaN}}}',
        b"Infinity",
        b"-Infinity",
        b"\xff\xfe",
    ],
)
def test_malformed_json_is_a_plain_400(bridge, connect, body):
    _, server, _ = bridge
    status, content_type, answer = connect(server.socket_path).post("/status/send", body)
    assert status == 400
    assert content_type.startswith("text/plain")
    assert answer.startswith(b"Failed to parse the request body as JSON")


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/resources/fetch", {"type": "scheduler", "peer": "12D3KooWnobody", "dataset": "toy"}),
        ("/resources/fetch", {"type": 2, "peers": [], "strategy": {"type": "All"}}),
        ("/status/send", {"status": {"batch_size": 8.0}}),
        ("/status/send", {"status": {"batch_size": -1}}),
        ("/status/send", {"status": {}}),
        ("/status/send", {"metrics": {"round": 1, "metrics": {"loss": "low"}}}),
        ("/status/send", "finished"),
        ("/status/send", {"status": {"batch_size": 8}, "metrics": {}}),
        ("/resources/fetch", {"repository": "local/tiny-gpt2"}),
        (
            "/resources/fetch",
            {"type": "huggingface", "repository": "r", "filenames": "config.json"},
        ),
        ("/resources/send", {"path": "x"}),
        (
            "/resources/receive",
            {"resource": {"type": "peers", "peers": [], "strategy": {"type": "Most"}}},
        ),
    ],
)
def test_wrong_shape_is_a_plain_422(bridge, connect, route, body):
    _, server, _ = bridge
    status, content_type, answer = connect(server.socket_path).post(route, body)
    assert status == 422
    assert content_type.startswith("text/plain")
    assert answer.startswith(b"Failed to deserialize the JSON body")


def test_body_over_2_mib_is_a_plain_413(bridge, connect):
    _, server, _ = bridge
    big = json.dumps({"status": {"batch_size": 8, "pad": "x" * (2 * 1024 * 1024)}}).encode()
    status, content_type, _ = connect(server.socket_path).post("/status/send", big)
    assert status == 413 and content_type.startswith("text/plain")
    # Chunked bodies are held to the same limit.
    connection = connect(server.socket_path)
    connection.request(
        "POST",
        "/status/send",
        body=iter([big[:1_500_000], big[1_500_000:]]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 413
    # Just under the limit is fine, chunked too.
    small = json.dumps({"status": {"batch_size": 8, "pad": "x" * 1000}}).encode()
    connection = connect(server.socket_path)
    connection.request(
        "POST",
        "/status/send",
        body=iter([small[:10], small[10:]]),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())) == (200, {"type": "Continue"})


def test_expect_100_continue_is_answered_before_the_body(bridge):
    _, server, _ = bridge
    body = json.dumps({"status": {"batch_size": 8}}).encode()
    head = (
        "POST /status/send HTTP/1.1\r\nHost: hypha\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(10)
        client.connect(str(server.socket_path))
        client.sendall(head.encode())
        assert client.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n")
        client.sendall(body)
        answer = b""
        while not answer.endswith(b'{"type": "Continue"}'):
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_unknown_route_and_wrong_method(bridge, connect):
    _, server, _ = bridge
    connection = connect(server.socket_path)
    connection.request("GET", "/nothing")
    response = connection.getresponse()
    response.read()
    assert response.status == 404
    connection.request("GET", "/status/send")
    response = connection.getresponse()
    response.read()
    assert response.status == 405


def test_paths_outside_the_work_dir_are_refused(bridge, connect, tmp_path):
    _, server, job = bridge
    updates = job["executor"]["config"]["updates"]
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"secret")
    os.symlink(tmp_path, server.work_dir / "escape")
    connection = connect(server.socket_path)
    for path, fragment in [
        (str(outside), "absolute"),
        ("../secret.bin", ".."),
        ("a/../../secret.bin", ".."),
        ("escape/secret.bin", "symlink"),
        ("", "empty"),
    ]:
        status, answer = connection.post_json(
            "/resources/send", {"resource": updates, "path": path}
        )
        assert status == 400, path
        assert answer["error"] == "invalid_request" and fragment in answer["detail"], answer
    for path in ["../incoming", "/tmp", "escape"]:
        status, answer = connection.post_json(
            "/resources/receive", {"resource": PEERS_ALL, "path": path}
        )
        assert (status, answer["error"]) == (400, "invalid_request"), path


def test_fetch_into_a_symlinked_artifacts_dir_is_refused(bridge, connect, tmp_path):
    _, server, job = bridge
    os.symlink(tmp_path, server.work_dir / "artifacts")
    status, answer = connect(server.socket_path).post_json(
        "/resources/fetch", job["executor"]["config"]["model"]["artifact"]
    )
    assert (status, answer["error"]) == (400, "invalid_request")
    assert not (tmp_path / "config.json").exists()


def test_send_of_a_missing_file_is_an_io_error(bridge, connect):
    _, server, job = bridge
    body = {"resource": job["executor"]["config"]["updates"], "path": "nothing.safetensors"}
    status, answer = connect(server.socket_path).post_json("/resources/send", body)
    assert (status, answer["error"]) == (500, "io_error")


def test_send_and_receive_need_peers_references(bridge, connect):
    _, server, job = bridge
    (server.work_dir / "g.bin").write_bytes(b"g")
    connection = connect(server.socket_path)
    data = job["executor"]["config"]["data"]
    status, answer = connection.post_json("/resources/send", {"resource": data, "path": "g.bin"})
    assert (status, answer["error"]) == (400, "invalid_request")
    one = {**PEERS_ALL, "strategy": {"type": "One"}}
    status, answer = connection.post_json("/resources/receive", {"resource": one})
    assert (status, answer["error"]) == (400, "invalid_request") and "All" in answer["detail"]


def test_send_push_and_receive_stream(bridge, connect, receive):
    coordinator, server, job = bridge
    config = job["executor"]["config"]
    status, content_type, stream = receive(
        server.socket_path, {"resource": config["results"], "path": "incoming"}
    )
    assert status == 200 and content_type == "text/event-stream"
    # Nothing happens: keepalive comments come (every 0.2 s here).
    assert stream.next_line() == b": keepalive\n"
    assert stream.next_line() == b"\n"
    save_file({"w": torch.ones(2, 2)}, str(server.work_dir / "round-0.safetensors"))
    status, _, body = connect(server.socket_path).post(
        "/resources/send", {"resource": config["updates"], "path": "round-0.safetensors"}
    )
    assert (status, body) == (200, b"")
    # One worker: its pseudo-gradient closes the round, the update comes back on the stream.
    event = stream.next_event()
    ps = coordinator.parameter_server_peer
    assert event == {
        "path": f"incoming/{ps}",
        "size": (server.work_dir / "incoming" / ps).stat().st_size,
        "from_peer": ps,
    }
    assert mode(server.work_dir / "incoming" / ps) == 0o600
    update = load_file(server.work_dir / event["path"])
    torch.testing.assert_close(update["w"], torch.full((2, 2), 0.7 * (0.9 * 1 + 1)))
    # A second receive stream answers 200 and ends at once; the first lives on.
    status, content_type, second = receive(server.socket_path, {"resource": config["results"]})
    assert status == 200 and content_type == "text/event-stream"
    assert second.next_line() is None
    assert stream.next_line() in (b": keepalive\n", b"\n")
    # stop() ends the open stream and removes the socket.
    server.stop()
    lines = []
    while (line := stream.next_line()) is not None:
        lines.append(line)
    assert all(line in (b": keepalive\n", b"\n") for line in lines)
    assert not server.socket_path.exists()
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as client:
        client.connect(str(server.socket_path))


def test_the_stream_head_comes_at_once_not_with_the_first_keepalive(
    make_coordinator, make_bridge, receive
):
    coordinator = make_coordinator(workers=1)
    server, job = make_bridge(coordinator, keepalive_s=60.0)
    # receive() gives up after 10 s: far less than the first keepalive.
    status, content_type, _ = receive(
        server.socket_path, {"resource": job["executor"]["config"]["results"]}
    )
    assert (status, content_type) == (200, "text/event-stream")


def test_push_without_an_open_stream_is_written_but_not_announced(bridge, connect, receive):
    coordinator, server, job = bridge
    config = job["executor"]["config"]
    save_file({"w": torch.ones(1)}, str(server.work_dir / "g.safetensors"))
    assert (
        connect(server.socket_path).post(
            "/resources/send", {"resource": config["updates"], "path": "g.safetensors"}
        )[0]
        == 200
    )
    written = server.work_dir / "incoming" / coordinator.parameter_server_peer
    deadline = time.monotonic() + 10
    while not written.exists():
        assert time.monotonic() < deadline, "the push never reached the disk"
        time.sleep(0.05)
    # Opened later, the stream does not replay it: only keepalives until the bridge stops.
    _, _, stream = receive(server.socket_path, {"resource": config["results"]})
    for _ in range(4):
        assert stream.next_line() in (b": keepalive\n", b"\n")


def test_scheduler_rounds_and_no_status_while_an_update_is_in_flight(bridge, connect):
    coordinator, server, _ = bridge
    connection = connect(server.socket_path)
    batch = {"status": {"batch_size": 8, "loss": 2.5}}
    # A target of 4 batches of 8, batches that take no time: after the second status the
    # projection ends in 2 more batches, within the caps (3 batches, 10 s): ScheduleUpdate,
    # exactly once.
    answers = [connection.post_json("/status/send", batch)[1] for _ in range(4)]
    assert answers == [
        {"type": "Continue"},
        {"type": "ScheduleUpdate", "counter": 2},
        {"type": "Continue"},
        {"type": "Continue"},
    ]
    assert connection.post_json(
        "/status/send", {"metrics": {"round": 0, "metrics": {"loss": 2.5}}}
    ) == (200, {"type": "Ok"})
    assert connection.post_json("/status/send", "update") == (200, {"type": "Ok"})
    assert connection.post_json("/status/send", batch) == (200, {"type": "Error"})
    record = next(iter(coordinator.workers.values()))
    assert record.violations == ["status while updating"]
    assert record.metrics == {0: {"loss": 2.5}}
    assert record.rounds[0].batches == 4 and record.rounds[0].samples == 32


def test_update_received_answers_continue_then_done(
    make_coordinator, make_bridge, connect, receive
):
    coordinator = make_coordinator(workers=1, rounds=2, samples_per_round=2, clock=lambda: 0.0)
    server, job = make_bridge(coordinator)
    config = job["executor"]["config"]
    _, _, stream = receive(server.socket_path, {"resource": config["results"]})
    connection = connect(server.socket_path)
    held = server.work_dir / "held-update"
    for round_, expected in enumerate(({"type": "Continue"}, {"type": "Done"})):
        # The target is one status of 2 samples: reached at once, so ScheduleUpdate{0}.
        assert connection.post_json("/status/send", {"status": {"batch_size": 2}})[1] == {
            "type": "ScheduleUpdate",
            "counter": 0,
        }
        save_file({"w": torch.ones(1)}, str(server.work_dir / f"round-{round_}.safetensors"))
        assert (
            connection.post(
                "/resources/send",
                {"resource": config["updates"], "path": f"round-{round_}.safetensors"},
            )[0]
            == 200
        )
        assert connection.post_json("/status/send", "update")[1] == {"type": "Ok"}
        update = server.work_dir / stream.next_event()["path"]
        if round_ == 0:
            os.link(update, held)  # a reader still holding the first round's update
        else:
            # The second round's update was written into that same file, in place.
            assert os.path.samefile(update, held)
        assert connection.post_json("/status/send", "update-received")[1] == expected
    record = next(iter(coordinator.workers.values()))
    assert record.violations == []
    assert [aggregation["workers"] for aggregation in coordinator.aggregation.rounds] == [
        ["w1"],
        ["w1"],
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_owner_gets_the_socket_and_every_written_file(make_coordinator, make_bridge, connect):
    coordinator = make_coordinator(workers=1)
    server, job = make_bridge(coordinator, owner=(4321, 4322))
    assert (os.stat(server.socket_path).st_uid, os.stat(server.socket_path).st_gid) == (4321, 4322)
    status, files = connect(server.socket_path).post_json(
        "/resources/fetch", job["executor"]["config"]["model"]["artifact"]
    )
    assert status == 200
    for path in [
        server.work_dir / "artifacts",
        *(server.work_dir / entry["path"] for entry in files),
    ]:
        assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322), path

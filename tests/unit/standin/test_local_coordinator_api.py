"""The coordinator's TCP API keeps connections alive, and its client reuses them safely."""

from __future__ import annotations

import http.client
import io
import json
from urllib.parse import urlsplit

import pytest

from hypha.standin.coordinator.client import CoordinatorClient
from hypha.standin.errors import BackendError


def test_one_connection_carries_every_request_errors_included(make_coordinator):
    coordinator = make_coordinator(workers=1)
    url = urlsplit(coordinator.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    exchanges = [
        ("POST", "/jobs", {"worker": "w1"}, 200),
        # A refused request with a body: the body must not be taken for the next request.
        ("POST", "/nothing/here", {"padding": "x" * 5000}, 404),
        ("GET", "/blobs/unknown", None, 404),
        ("POST", "/jobs", b"{not json", 400),
        ("GET", "/health", None, 200),
    ]
    sockets = set()
    for method, path, payload, status in exchanges:
        body = payload if isinstance(payload, bytes | None) else json.dumps(payload).encode()
        connection.request(method, path, body=body)
        response = connection.getresponse()
        response.read()
        assert (response.status, response.will_close) == (status, False), path
        sockets.add(connection.sock)
    assert len(sockets) == 1
    connection.close()


def test_client_answers_stay_in_order_across_errors_and_downloads(make_coordinator):
    coordinator = make_coordinator(workers=1, steps_per_round=4, clock=lambda: 0.0)
    client = CoordinatorClient(coordinator.url)
    job = json.loads(client.request_job("w1"))
    backend = client.backend(job["job_id"])
    config = job["executor"]["config"]
    with pytest.raises(BackendError) as refused:
        backend.fetch({**config["data"], "dataset": "other"})
    assert refused.value.kind == "connector_error"
    [slice_file] = backend.fetch(config["data"])
    with pytest.raises(BackendError):
        backend.download("unknown", io.BytesIO())
    out = io.BytesIO()
    backend.download(slice_file.blob, out)
    assert out.getvalue() == (coordinator.catalog.dataset_dir / "0.safetensors").read_bytes()
    assert backend.status({"status": {"batch_size": 8}}) == {"type": "Continue"}
    assert client.call("GET", "/health") == {"ok": True}
    assert backend.status({"status": {"batch_size": 8}}) == {"type": "ScheduleUpdate", "counter": 2}


def test_a_stopped_coordinator_is_unreachable_through_a_kept_connection(make_coordinator):
    coordinator = make_coordinator(workers=1)
    client = CoordinatorClient(coordinator.url)
    assert client.call("GET", "/health") == {"ok": True}
    coordinator.stop()
    with pytest.raises(BackendError) as gone:
        client.call("GET", "/health")
    assert gone.value.kind == "network_error"

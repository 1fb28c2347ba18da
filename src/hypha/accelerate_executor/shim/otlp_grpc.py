"""The relay's OTLP/gRPC side (docs/telemetry.md): each export the executor posted to the
relay socket as OTLP/HTTP protobuf, sent on as a gRPC unary call to the collector's Export
method, and the collector's answer turned back into the HTTP answer the exporter expects.

The request and response of OTLP/HTTP's protobuf encoding are the gRPC service's own
messages (Export<Signal>ServiceRequest and ...Response), so the bytes pass through untouched
in both directions: no protobuf classes are needed here, only grpcio, which the shim imports
only when a signal goes over gRPC.
"""

from __future__ import annotations

import threading
from http import HTTPStatus

import grpc

from hypha.accelerate_executor.shim.otlp_upstream import GrpcRoute, Upstream

# The collector services' Export methods (opentelemetry-proto's collector/*/v1/*_service.proto).
METHODS = {
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
}
# A gRPC status as the HTTP status an OTLP/HTTP exporter acts on the same way: the codes the
# OTLP spec calls retryable become 429/503/504, which the exporter retries; any other, a
# status it drops the batch on (grpc-gateway's mapping, for the non-retryable ones).
HTTP_STATUS = {
    grpc.StatusCode.OK: HTTPStatus.OK,
    grpc.StatusCode.CANCELLED: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
    grpc.StatusCode.ABORTED: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.OUT_OF_RANGE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: HTTPStatus.FORBIDDEN,
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
}
PROTOBUF = "application/x-protobuf"


class GrpcForwarder:
    """One channel per collector, opened at the first export and kept for the job's life;
    safe to call from the relay's handler threads at once."""

    def __init__(self, upstream: Upstream, timeout_s: float) -> None:
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._channels: dict[GrpcRoute, grpc.Channel] = {}
        self._lock = threading.Lock()

    def export(self, signal: str, body: bytes) -> tuple[int, bytes, str]:
        """(HTTP status, body, content type) for the exporter that posted `body`."""
        # gRPC metadata keys are lowercase; parse_env_headers already made them so.
        metadata = tuple(self._upstream.headers[signal].items())
        # No serializers: the bytes go as they came, the answer comes back as bytes.
        call = self._channel(self._upstream.grpc[signal]).unary_unary(METHODS[signal])
        try:
            answer = call(body, timeout=self._timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = (exc.details() if isinstance(exc, grpc.Call) else None) or code.name
            status = HTTP_STATUS.get(code, HTTPStatus.BAD_REQUEST)
            return status, details.encode(errors="replace"), "text/plain"
        except ValueError:  # metadata gRPC refuses (a value outside printable ASCII)
            return HTTPStatus.BAD_REQUEST, b"OTLP header not valid as gRPC metadata", "text/plain"
        return HTTPStatus.OK, answer, PROTOBUF

    def _channel(self, route: GrpcRoute) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(route)
            if channel is None:
                if route.secure:
                    credentials = grpc.ssl_channel_credentials(self._upstream.root_certificates)
                    channel = grpc.secure_channel(route.target, credentials)
                else:
                    channel = grpc.insecure_channel(route.target)
                self._channels[route] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

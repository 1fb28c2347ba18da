"""Where the shim's telemetry relay sends each signal, read from the worker's OTEL_*
variables by the OTLP exporter spec's rules (docs/telemetry.md): the endpoint, the protocol
(OTLP/HTTP protobuf or OTLP/gRPC), the headers, TLS. Plain data, no I/O but the CA file, and
neither grpcio nor torch: the shim starts fast.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypha.accelerate_executor.telemetry import wanted

SIGNALS = ("logs", "metrics", "traces")
PROTOCOLS = ("http/protobuf", "grpc")


class TelemetryConfigError(Exception):
    """The worker's OTEL_* variables ask for what the relay cannot do."""


@dataclass(frozen=True)
class GrpcRoute:
    """A signal's OTLP/gRPC collector: `target` host:port, over TLS when `secure`."""

    target: str
    secure: bool


@dataclass(frozen=True)
class Upstream:
    """Where each signal goes (an OTLP/HTTP URL in `urls`, or a collector in `grpc`), and
    with which headers; repr() leaves the headers out."""

    urls: dict[str, str]
    headers: dict[str, dict[str, str]] = field(repr=False)
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    grpc: dict[str, GrpcRoute] = field(default_factory=dict)
    # The CA bundle of OTEL_EXPORTER_OTLP_CERTIFICATE, PEM, for gRPC's TLS.
    root_certificates: bytes | None = field(default=None, repr=False)


def _headers(value: str | None) -> dict[str, str]:
    if not value:
        return {}
    from opentelemetry.util.re import parse_env_headers

    return dict(parse_env_headers(value, liberal=True))


def _protocol(env: Mapping[str, str], signal: str) -> tuple[str, str]:
    """A signal's OTLP protocol by the spec's rules, and the variable that set it: its own
    variable, else the common one, else http/protobuf."""
    for variable in (
        f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ):
        value = (env.get(variable) or "").strip()
        if value:
            return variable, value
    return "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def grpc_route(endpoint: str, insecure: str | None) -> GrpcRoute:
    """The OTLP exporter spec's gRPC endpoint: used as it is (no /v1/<signal>), its scheme
    choosing TLS (https) or plaintext (http); without a scheme, TLS unless
    OTEL_EXPORTER_OTLP_INSECURE (or the signal's own) is true."""
    scheme, found, rest = endpoint.partition("://")
    if not found:
        scheme, rest = "", endpoint
    elif scheme not in ("http", "https"):
        raise TelemetryConfigError(f"OTLP/gRPC endpoint {endpoint} is neither http:// nor https://")
    target = rest.split("/", 1)[0]
    if not target:
        raise TelemetryConfigError(f"OTLP/gRPC endpoint {endpoint} names no host")
    secure = scheme == "https" or (not scheme and not _true(insecure))
    return GrpcRoute(target, secure)


def upstream_from(env: Mapping[str, str]) -> Upstream | None:
    """The endpoint the worker configured, by the OTLP exporter's rules: over OTLP/HTTP, a
    signal's own OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT as it is, else
    OTEL_EXPORTER_OTLP_ENDPOINT plus /v1/<signal>; over gRPC, either as it is. None when
    telemetry is off. Torch- and grpc-free: the shim starts fast."""
    if not wanted(env):
        return None
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ""
    common = _headers(env.get("OTEL_EXPORTER_OTLP_HEADERS"))
    urls: dict[str, str] = {}
    grpc: dict[str, GrpcRoute] = {}
    headers: dict[str, dict[str, str]] = {}
    for signal in SIGNALS:
        variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}"
        own = env.get(f"{variable}_ENDPOINT")
        if not (own or base):
            continue
        named, protocol = _protocol(env, signal)
        if protocol not in PROTOCOLS:
            if signal == "traces":  # the executor makes no spans: nothing to refuse for
                continue
            raise TelemetryConfigError(
                f"{named}={protocol} is not relayed (only http/protobuf or grpc)"
            )
        if protocol == "grpc":
            insecure = env.get(f"{variable}_INSECURE") or env.get("OTEL_EXPORTER_OTLP_INSECURE")
            grpc[signal] = grpc_route(own or base, insecure)
        else:
            urls[signal] = own or f"{base.rstrip('/')}/v1/{signal}"
        headers[signal] = {**common, **_headers(env.get(f"{variable}_HEADERS"))}
    if not headers:  # only HYPHA_OTLP_SOCKET: this shim is not the one to relay
        return None
    certificate = env.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
    tls, root_certificates = None, None
    if certificate:
        try:
            tls = ssl.create_default_context(cafile=certificate)
            with open(certificate, "rb") as pem:
                root_certificates = pem.read()
        except (OSError, ssl.SSLError) as exc:
            raise TelemetryConfigError(
                f"OTEL_EXPORTER_OTLP_CERTIFICATE={certificate}: {exc.strerror or exc}"
            ) from None
    return Upstream(urls, headers, tls, grpc, root_certificates)

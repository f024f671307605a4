#!/usr/bin/env bash
# OpenTelemetry tracing: spans of every request to an OTLP/HTTP
# collector, the caller's traceparent honoured, the OTLP JSON encoding of
# the OpenTelemetry JS SDK, failures of the collector harmless, the last
# spans sent at shutdown (tests/server/trace.js starts its own servers).
source "$KILN_SRC/tests/server/serve.sh"
serve_node trace.js "$KILN" "$KILN_MODELS/stories260K" "$KILN_SRC/tests/server/chatml.jinja"

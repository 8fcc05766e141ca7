"""What an operator sees of a running server: Prometheus metrics (`metrics`, served by
`exposition`), the cost of LM calls from a per-model price table (`prices`) and OpenTelemetry
traces (`tracing`, off unless the standard OTEL_* variables ask for them).

The layers call narrow hooks here (one function per thing that happened); nothing in this package
imports another rlm-mcp layer but the neutral settings, so the engine, the LM client, the sandbox
and the stores may all report through it.
"""

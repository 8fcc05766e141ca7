"""Whether a trace is recorded is the operator's decision, never a caller's.

The SDK's default sampler (`parentbased_always_on`) follows a remote parent's sampled flag: a
client that sends `traceparent: ...-00` switched rlm-mcp's tracing off for its calls, and one
that sends `-01` would force every call traced past an operator's ratio. Here a span whose parent
comes from outside the process (a caller's `traceparent`, or a run record's on a team worker) is
decided by the operator's sampler (OTEL_TRACES_SAMPLER and its argument) as if it began the
trace: the caller's trace id is kept, so the spans still join the caller's trace when both
sides record it. A span whose parent is in this process follows that parent, so a trace is
recorded whole or not at all. Imports the OpenTelemetry SDK: used only where it is installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span
from opentelemetry.util.types import Attributes

__all__ = ["OwnDecision", "operator_sampler"]


class OwnDecision(Sampler):
    """The operator's sampler for spans with no parent or a remote one; the parent's decision
    for spans with a parent in this process."""

    def __init__(self, operator: Sampler) -> None:
        self._operator = operator
        self._local = ParentBased(root=operator)  # a local parent: its decision

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        if parent.is_valid and not parent.is_remote:
            return self._local.should_sample(parent_context, trace_id, name, kind, attributes, links)
        # A root, or a parent from outside: decided as a root. The empty context (not None,
        # which means "the current one") hides the parent's flag and its tracestate.
        return self._operator.should_sample(Context(), trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return f"OwnDecision{{{self._operator.get_description()}}}"


def operator_sampler() -> Sampler:
    """`OwnDecision` over the sampler OTEL_TRACES_SAMPLER names. A parent-based one (the default
    `parentbased_always_on`) works as its root sampler for what `OwnDecision` asks it: always
    with an empty context."""
    return OwnDecision(TracerProvider(shutdown_on_exit=False).sampler)  # the SDK's reading of the variables

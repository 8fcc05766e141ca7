"""The service layer: what each tool call means, independent of MCP.

`RlmService` holds the process's parts and their lifecycle; `Caller(service, owner)` is every
tool-level operation as one owner sees it (the owner bound once).

Owns resolving contexts (loaders), starting, tracking and cancelling runs, the per-run limits
callers may override (`RunOverrides`), mapping run events to progress lines, and the choice of
channel for a run's failure (raised before the run started, a structured result after).
Must not hold transport details: the server and the CLI are both its callers.
"""

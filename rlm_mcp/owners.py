"""Who owns contexts and runs (issue 14 item 11; README "Security").

Every stored context and every run belongs to an owner, a short opaque string:
- stdio (and the CLI's `run`) serve one user, `LOCAL_OWNER`;
- over HTTP without tokens (loopback only) every client is that same one user;
- over HTTP with tokens each token is its own owner (`access.owner_of_token`): what one
  token stored or started, another token cannot see, use, cancel or delete ("not found").

The owner is read from the MCP request in one place (`server.app`) and passed down; the store
keeps ownership in a table of its own, so identical bytes stored by two owners share one blob
without either learning that the other has it.
"""

from __future__ import annotations

LOCAL_OWNER = "local"

"""The context store's pin rule in SQL, written once: the statements that pin contexts
(`contexts._PIN`, a run's own pin; `queue_statements.CLAIM`, the pins of every run a claim takes)
are composed around `PIN_RULE`.

The rule (`store.contexts.Contexts._pin`'s, in one statement): each holder's ids resolved to its
owner's rows, each marked used (the context's and the owner's `last_used_at`) and pinned for this
replica under the holder's pin id, all or none per holder: its writes apply only when every
distinct id it asked for was found.

A statement using it first defines two CTEs:
- `want (pin_id, owner, cid)`: the ids each holder pins, for its owner, under its pin id (more
  columns may follow);
- `holders (pin_id, expected)`: each holder and how many distinct ids it must find (a holder that
  asks for none is one too: all of its none are found).
`PIN_RULE` then defines `t (now)` (the database's clock as Unix seconds: what every write
stamps), `found` (the rows found, one per holder and context: the columns a
`ContextInfo` needs but `last_used_at`, which is `t.now` once pinned), `ok` (the holders whose every id
was found: `holders`' columns), and the writes; its parameters are `%(replica)s` and `%(ttl)s`.
"""

from __future__ import annotations

__all__ = ["PIN_RULE"]

PIN_RULE = (
    "t AS (SELECT extract(epoch FROM now())::float8 AS now), "
    "found AS (SELECT DISTINCT w.pin_id, w.owner, c.context_id, c.sha256, c.bytes, c.format, c.kind, c.chars, "
    "  o.name, o.source, o.created_at FROM want w "
    "  JOIN rlm_contexts c ON c.context_id = w.cid "
    "  JOIN rlm_context_owners o ON o.context_id = c.context_id AND o.owner = w.owner), "
    "ok AS (SELECT h.* FROM holders h "
    "  WHERE h.expected = (SELECT count(*) FROM found f WHERE f.pin_id = h.pin_id)), "
    "touched AS (UPDATE rlm_contexts c SET last_used_at = t.now FROM t "
    "  WHERE c.context_id IN (SELECT f.context_id FROM found f JOIN ok ON ok.pin_id = f.pin_id)), "
    "owned AS (UPDATE rlm_context_owners o SET last_used_at = t.now FROM t "
    "  WHERE (o.context_id, o.owner) IN (SELECT f.context_id, f.owner FROM found f JOIN ok ON ok.pin_id = f.pin_id)), "
    "pinned AS (INSERT INTO rlm_pins SELECT f.pin_id, f.context_id, %(replica)s, f.owner, t.now + %(ttl)s "
    "  FROM found f JOIN ok ON ok.pin_id = f.pin_id, t)"
)

"""PostgreSQL migrations of team mode's schema (rlm_mcp.store.pg.migrations applies them)."""

"""SQLite migrations of the metadata index (rlm_mcp.store._db applies them)."""

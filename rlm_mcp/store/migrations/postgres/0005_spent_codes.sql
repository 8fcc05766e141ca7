-- The viewer's one-time login codes, spent once on any replica (rlm_mcp.store.pg.spent_codes):
-- a hash of each spent code until a while after it expired.
CREATE TABLE rlm_spent_codes (
    code_sha256  text PRIMARY KEY,
    expires_at   double precision NOT NULL
);
CREATE INDEX rlm_spent_codes_expiry ON rlm_spent_codes (expires_at);

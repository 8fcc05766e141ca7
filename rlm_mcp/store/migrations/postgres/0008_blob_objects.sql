-- Object storage for team mode (RLM_MCP_BLOB_URL; rlm_mcp.store.pg.bucket_blobs): the database
-- keeps the index, the bucket the bytes.
--
-- - `rlm_blob_owner_keys`: a random key per owner, the first part of its objects' keys, so no key
--   reveals a token or a token's hash, and each owner's objects are its own (deduplication stays
--   within an owner, as with the rows).
-- - `rlm_objects`: one row per object in the bucket. `intent` is written (and committed) before
--   the object, `live` once the context or snapshot that uses it committed, `doomed` when nothing
--   refers to it any more; times are the database's clock. A sweep removes the objects of doomed
--   rows, and of intent rows older than the grace period (a front killed mid-upload), then the rows.
--   `sha256` and `owner`: a context's content and holder; `session_id`: a snapshot's session.
CREATE TABLE rlm_blob_owner_keys (
    owner  text PRIMARY KEY,
    key    text NOT NULL UNIQUE
);
CREATE TABLE rlm_objects (
    key         text PRIMARY KEY,
    state       text NOT NULL,
    sha256      text,
    owner       text,
    session_id  text,
    bytes       bigint NOT NULL DEFAULT 0,
    created_at  double precision NOT NULL
);
CREATE INDEX rlm_objects_sha ON rlm_objects (sha256, owner) WHERE sha256 IS NOT NULL;
CREATE INDEX rlm_objects_session ON rlm_objects (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX rlm_objects_state ON rlm_objects (state, created_at);

-- Uploads record the owner that started them: only it may continue one, and each
-- owner's unfinished bytes count against its own share (rlm_mcp.store.owner_caps).
-- Rows from before have none and expire within a day.
ALTER TABLE rlm_uploads ADD COLUMN owner text;
CREATE INDEX rlm_uploads_owner ON rlm_uploads (owner) WHERE NOT done;

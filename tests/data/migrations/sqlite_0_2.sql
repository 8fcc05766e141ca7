-- An SQLite index written by rlm-mcp 0.2 (82f2786): tests/data/migrations/make_dumps.py
BEGIN TRANSACTION;
CREATE TABLE context_owners (
    context_id   TEXT NOT NULL,
    owner        TEXT NOT NULL,
    name         TEXT NOT NULL,
    source       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL,
    PRIMARY KEY (context_id, owner)
);
INSERT INTO "context_owners" VALUES('ctx_9e19bb00bc82dbe5c79388b7','local','local notes','{"kind": "inline"}',1.79566736705757141112e+09,1.79566736705757141112e+09);
INSERT INTO "context_owners" VALUES('ctx_67837b265edccb022b3e7b00','token-alice','alice''s','{"kind": "inline"}',1795667367.07136,1795667367.07136);
INSERT INTO "context_owners" VALUES('ctx_d102fd0d2b12d3652b5e8214','token-alice','uploaded','{"type": "upload", "upload_id": "upl_845064e21d8036252dbc9395", "chunks": 1, "bytes": 16}',1.79566736707314109806e+09,1.79566736707314109806e+09);
CREATE TABLE contexts (
    context_id   TEXT PRIMARY KEY,
    sha256       TEXT NOT NULL,
    name         TEXT NOT NULL,
    bytes        INTEGER NOT NULL,
    format       TEXT NOT NULL,
    kind         TEXT NOT NULL,
    chars        INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL,
    source       TEXT NOT NULL
);
INSERT INTO "contexts" VALUES('ctx_9e19bb00bc82dbe5c79388b7','9e19bb00bc82dbe5c79388b746a078df2c478cf6f4966851d637f5c329d8ffbf','local notes',23,'text','str',23,1.79566736705757141112e+09,1.79566736705757141112e+09,'{"kind": "inline"}');
INSERT INTO "contexts" VALUES('ctx_67837b265edccb022b3e7b00','67837b265edccb022b3e7b00e2128285f62997961d12d1d19cb29e36c17389d6','alice''s',16,'text','str',16,1795667367.07136,1795667367.07136,'{"kind": "inline"}');
INSERT INTO "contexts" VALUES('ctx_d102fd0d2b12d3652b5e8214','d102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f','uploaded',16,'text','str',16,1.79566736707314109806e+09,1.79566736707314109806e+09,'{"type": "upload", "upload_id": "upl_845064e21d8036252dbc9395", "chunks": 1, "bytes": 16}');
CREATE TABLE pins (
    pin_id      TEXT NOT NULL,
    context_id  TEXT NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    proc_start  TEXT,
    expires_at  REAL NOT NULL,
    owner       TEXT
);
CREATE TABLE uploads (
    upload_id      TEXT PRIMARY KEY,
    next_index     INTEGER NOT NULL,
    bytes_received INTEGER NOT NULL,
    last_chunk_sha TEXT,
    name           TEXT,
    format         TEXT,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    done           INTEGER NOT NULL DEFAULT 0,
    context_id     TEXT,
    owner          TEXT
);
INSERT INTO "uploads" VALUES('upl_845064e21d8036252dbc9395',1,16,'d102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f','uploaded','text',1.79566736707239151004e+09,1.79566736707383131982e+09,1,'ctx_d102fd0d2b12d3652b5e8214','token-alice');
INSERT INTO "uploads" VALUES('upl_9808d81e517ed43ef93ffbc1',1,11,'3087c955f449f4301e10ecb6f6997e3ade20fd6f070e61c160075767cf7f881b','partial','text',1.79566736707479023939e+09,1.79566736707479023939e+09,0,NULL,'token-alice');
CREATE INDEX contexts_sha ON contexts (sha256);
CREATE INDEX contexts_lru ON contexts (last_used_at);
CREATE INDEX pins_ctx ON pins (context_id);
CREATE INDEX context_owners_owner ON context_owners (owner, last_used_at);
COMMIT;

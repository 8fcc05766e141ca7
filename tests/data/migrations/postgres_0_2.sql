-- A PostgreSQL database written by rlm-mcp 0.2 (82f2786), schema version 6:
-- tests/data/migrations/make_dumps.py
--
-- PostgreSQL database dump
--


-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: rlm_blob_chunks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_blob_chunks (
    sha256 text NOT NULL,
    idx integer NOT NULL,
    data bytea NOT NULL
);
ALTER TABLE ONLY public.rlm_blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;


--
-- Name: rlm_blobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_blobs (
    sha256 text NOT NULL,
    bytes bigint NOT NULL,
    chunks integer NOT NULL,
    created_at double precision NOT NULL
);


--
-- Name: rlm_context_owners; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_context_owners (
    context_id text NOT NULL,
    owner text NOT NULL,
    name text NOT NULL,
    source text NOT NULL,
    created_at double precision NOT NULL,
    last_used_at double precision NOT NULL
);


--
-- Name: rlm_contexts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_contexts (
    context_id text NOT NULL,
    sha256 text NOT NULL,
    name text NOT NULL,
    bytes bigint NOT NULL,
    format text NOT NULL,
    kind text NOT NULL,
    chars bigint NOT NULL,
    created_at double precision NOT NULL,
    last_used_at double precision NOT NULL,
    source text NOT NULL
);


--
-- Name: rlm_pins; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_pins (
    pin_id text NOT NULL,
    context_id text NOT NULL,
    replica_id text NOT NULL,
    owner text NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: rlm_replicas; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_replicas (
    replica_id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    started_at double precision NOT NULL,
    seen_at double precision NOT NULL
);


--
-- Name: rlm_run_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_run_events (
    run_id text NOT NULL,
    seq bigint NOT NULL,
    line text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL
);


--
-- Name: rlm_runs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_runs (
    run_id text NOT NULL,
    owner text NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    summary text NOT NULL,
    log_bytes bigint DEFAULT 0 NOT NULL,
    next_seq bigint DEFAULT 0 NOT NULL,
    worker_id bigint,
    lm_called boolean DEFAULT false NOT NULL,
    requeues integer DEFAULT 0 NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    need integer DEFAULT 1 NOT NULL,
    queued_at timestamp with time zone DEFAULT now() NOT NULL,
    claimed_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    done boolean GENERATED ALWAYS AS ((state = 'done'::text)) STORED,
    CONSTRAINT rlm_runs_state CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'done'::text])))
);


--
-- Name: rlm_schema; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_schema (
    version integer NOT NULL,
    applied_at timestamp with time zone
);


--
-- Name: rlm_secrets; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_secrets (
    name text NOT NULL,
    value bytea NOT NULL
);


--
-- Name: rlm_spent_codes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_spent_codes (
    code_sha256 text NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: rlm_upload_chunks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_upload_chunks (
    upload_id text NOT NULL,
    idx integer NOT NULL,
    data bytea NOT NULL
);


--
-- Name: rlm_uploads; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_uploads (
    upload_id text NOT NULL,
    next_index integer NOT NULL,
    bytes_received bigint NOT NULL,
    last_chunk_sha text,
    name text,
    format text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    done boolean DEFAULT false NOT NULL,
    finalizing boolean DEFAULT false NOT NULL,
    context_id text,
    owner text
);


--
-- Name: rlm_workers_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.rlm_workers_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: rlm_workers; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rlm_workers (
    worker_id bigint DEFAULT nextval('public.rlm_workers_id_seq'::regclass) NOT NULL,
    owner_id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at double precision NOT NULL,
    gone_at double precision,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    slots integer DEFAULT 0 NOT NULL
);


--
-- Data for Name: rlm_blob_chunks; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_blob_chunks VALUES ('9e19bb00bc82dbe5c79388b746a078df2c478cf6f4966851d637f5c329d8ffbf', 0, '\x6e6f746573206f6620746865206c6f63616c2075736572');
INSERT INTO public.rlm_blob_chunks VALUES ('67837b265edccb022b3e7b00e2128285f62997961d12d1d19cb29e36c17389d6', 0, '\x616c696365277320646f63756d656e74');
INSERT INTO public.rlm_blob_chunks VALUES ('d102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f', 0, '\x616e2075706c6f61642c2077686f6c65');


--
-- Data for Name: rlm_blobs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_blobs VALUES ('9e19bb00bc82dbe5c79388b746a078df2c478cf6f4966851d637f5c329d8ffbf', 23, 1, 1795667367.9083574);
INSERT INTO public.rlm_blobs VALUES ('67837b265edccb022b3e7b00e2128285f62997961d12d1d19cb29e36c17389d6', 16, 1, 1795667367.9263926);
INSERT INTO public.rlm_blobs VALUES ('d102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f', 16, 1, 1795667367.9345896);


--
-- Data for Name: rlm_context_owners; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_context_owners VALUES ('ctx_9e19bb00bc82dbe5c79388b7', 'local', 'local notes', '{"kind": "inline"}', 1795667367.9083574, 1795667367.9083574);
INSERT INTO public.rlm_context_owners VALUES ('ctx_67837b265edccb022b3e7b00', 'token-alice', 'alice''s', '{"kind": "inline"}', 1795667367.9263926, 1795667367.9263926);
INSERT INTO public.rlm_context_owners VALUES ('ctx_d102fd0d2b12d3652b5e8214', 'token-alice', 'uploaded', '{"type": "upload", "upload_id": "upl_a4cc67e4d0e4cc7918b3bfe2", "chunks": 1, "bytes": 16}', 1795667367.9345896, 1795667367.9345896);


--
-- Data for Name: rlm_contexts; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_contexts VALUES ('ctx_9e19bb00bc82dbe5c79388b7', '9e19bb00bc82dbe5c79388b746a078df2c478cf6f4966851d637f5c329d8ffbf', 'local notes', 23, 'text', 'str', 23, 1795667367.9083574, 1795667367.9083574, '{"kind": "inline"}');
INSERT INTO public.rlm_contexts VALUES ('ctx_67837b265edccb022b3e7b00', '67837b265edccb022b3e7b00e2128285f62997961d12d1d19cb29e36c17389d6', 'alice''s', 16, 'text', 'str', 16, 1795667367.9263926, 1795667367.9263926, '{"kind": "inline"}');
INSERT INTO public.rlm_contexts VALUES ('ctx_d102fd0d2b12d3652b5e8214', 'd102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f', 'uploaded', 16, 'text', 'str', 16, 1795667367.9345896, 1795667367.9345896, '{"type": "upload", "upload_id": "upl_a4cc67e4d0e4cc7918b3bfe2", "chunks": 1, "bytes": 16}');


--
-- Data for Name: rlm_pins; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: rlm_replicas; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: rlm_run_events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_run_events VALUES ('run_0123456789ab', 0, '{"type": "turn_start", "run_id": "run_0123456789ab", "iteration": 1, "max_iterations": 3, "depth": 0, "ts": 1795667367.949781}', 0);


--
-- Data for Name: rlm_runs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_runs VALUES ('run_0123456789ab', 'token-alice', 1795667367.948391, 1795667367.95074, '{"run_id": "run_0123456789ab", "query": "q", "context_ids": [], "owner": "token-alice", "limits": {"max_iterations": 0, "max_depth": 0, "timeout_s": 0.0, "token_budget": null, "max_errors": 0}, "created_at": 1795667367.948391, "status": "completed", "iterations": 0, "sub_calls": 0, "usage": {"total": {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}, "by_model": {}}, "result": {"status": "completed", "answer": "42", "reason": null, "run_id": "run_0123456789ab", "iterations": 0, "usage": {"total": {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}, "by_model": {}}, "duration_s": 0.0, "sub_calls": 0}, "version": 2}', 127, 1, NULL, false, 0, 'done', 0, 1, '2026-11-26 04:29:27.948866+00', NULL, false, DEFAULT);


--
-- Data for Name: rlm_schema; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_schema VALUES (1, '2026-11-26 04:29:27.883478+00');
INSERT INTO public.rlm_schema VALUES (2, '2026-11-26 04:29:27.893962+00');
INSERT INTO public.rlm_schema VALUES (3, '2026-11-26 04:29:27.895186+00');
INSERT INTO public.rlm_schema VALUES (4, '2026-11-26 04:29:27.895697+00');
INSERT INTO public.rlm_schema VALUES (5, '2026-11-26 04:29:27.897285+00');
INSERT INTO public.rlm_schema VALUES (6, '2026-11-26 04:29:27.898668+00');


--
-- Data for Name: rlm_secrets; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: rlm_spent_codes; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: rlm_upload_chunks; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_upload_chunks VALUES ('upl_3211ee0b44ba25ef44c3b7f5', 0, '\x68616c66206f6620616e20');


--
-- Data for Name: rlm_uploads; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.rlm_uploads VALUES ('upl_a4cc67e4d0e4cc7918b3bfe2', 1, 16, 'd102fd0d2b12d3652b5e8214442734f1cc1111706e9338013ef27b3db386293f', 'uploaded', 'text', 1795667367.9301186, 1795667367.9453616, true, false, 'ctx_d102fd0d2b12d3652b5e8214', 'token-alice');
INSERT INTO public.rlm_uploads VALUES ('upl_3211ee0b44ba25ef44c3b7f5', 1, 11, '3087c955f449f4301e10ecb6f6997e3ade20fd6f070e61c160075767cf7f881b', 'partial', 'text', 1795667367.9461637, 1795667367.9461637, false, false, NULL, 'token-alice');


--
-- Data for Name: rlm_workers; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Name: rlm_workers_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.rlm_workers_id_seq', 1, true);


--
-- Name: rlm_blob_chunks rlm_blob_chunks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_blob_chunks
    ADD CONSTRAINT rlm_blob_chunks_pkey PRIMARY KEY (sha256, idx);


--
-- Name: rlm_blobs rlm_blobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_blobs
    ADD CONSTRAINT rlm_blobs_pkey PRIMARY KEY (sha256);


--
-- Name: rlm_context_owners rlm_context_owners_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_context_owners
    ADD CONSTRAINT rlm_context_owners_pkey PRIMARY KEY (context_id, owner);


--
-- Name: rlm_contexts rlm_contexts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_contexts
    ADD CONSTRAINT rlm_contexts_pkey PRIMARY KEY (context_id);


--
-- Name: rlm_replicas rlm_replicas_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_replicas
    ADD CONSTRAINT rlm_replicas_pkey PRIMARY KEY (replica_id);


--
-- Name: rlm_run_events rlm_run_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_run_events
    ADD CONSTRAINT rlm_run_events_pkey PRIMARY KEY (run_id, attempt, seq);


--
-- Name: rlm_runs rlm_runs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_runs
    ADD CONSTRAINT rlm_runs_pkey PRIMARY KEY (run_id);


--
-- Name: rlm_secrets rlm_secrets_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_secrets
    ADD CONSTRAINT rlm_secrets_pkey PRIMARY KEY (name);


--
-- Name: rlm_spent_codes rlm_spent_codes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_spent_codes
    ADD CONSTRAINT rlm_spent_codes_pkey PRIMARY KEY (code_sha256);


--
-- Name: rlm_upload_chunks rlm_upload_chunks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_upload_chunks
    ADD CONSTRAINT rlm_upload_chunks_pkey PRIMARY KEY (upload_id, idx);


--
-- Name: rlm_uploads rlm_uploads_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_uploads
    ADD CONSTRAINT rlm_uploads_pkey PRIMARY KEY (upload_id);


--
-- Name: rlm_workers rlm_workers_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_workers
    ADD CONSTRAINT rlm_workers_pkey PRIMARY KEY (worker_id);


--
-- Name: rlm_context_owners_owner; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_context_owners_owner ON public.rlm_context_owners USING btree (owner, last_used_at);


--
-- Name: rlm_contexts_lru; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_contexts_lru ON public.rlm_contexts USING btree (last_used_at);


--
-- Name: rlm_contexts_sha; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_contexts_sha ON public.rlm_contexts USING btree (sha256);


--
-- Name: rlm_pins_ctx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_pins_ctx ON public.rlm_pins USING btree (context_id);


--
-- Name: rlm_runs_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_runs_created ON public.rlm_runs USING btree (created_at);


--
-- Name: rlm_runs_done; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_runs_done ON public.rlm_runs USING btree (owner, updated_at) WHERE (state = 'done'::text);


--
-- Name: rlm_runs_owner; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_runs_owner ON public.rlm_runs USING btree (owner, created_at);


--
-- Name: rlm_runs_queued; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_runs_queued ON public.rlm_runs USING btree (queued_at) WHERE (state = 'queued'::text);


--
-- Name: rlm_runs_running; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_runs_running ON public.rlm_runs USING btree (worker_id) WHERE (state = 'running'::text);


--
-- Name: rlm_spent_codes_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_spent_codes_expiry ON public.rlm_spent_codes USING btree (expires_at);


--
-- Name: rlm_uploads_owner; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rlm_uploads_owner ON public.rlm_uploads USING btree (owner) WHERE (NOT done);


--
-- Name: rlm_blob_chunks rlm_blob_chunks_sha256_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_blob_chunks
    ADD CONSTRAINT rlm_blob_chunks_sha256_fkey FOREIGN KEY (sha256) REFERENCES public.rlm_blobs(sha256) ON DELETE CASCADE;


--
-- Name: rlm_context_owners rlm_context_owners_context_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_context_owners
    ADD CONSTRAINT rlm_context_owners_context_id_fkey FOREIGN KEY (context_id) REFERENCES public.rlm_contexts(context_id) ON DELETE CASCADE;


--
-- Name: rlm_contexts rlm_contexts_sha256_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_contexts
    ADD CONSTRAINT rlm_contexts_sha256_fkey FOREIGN KEY (sha256) REFERENCES public.rlm_blobs(sha256);


--
-- Name: rlm_run_events rlm_run_events_run_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_run_events
    ADD CONSTRAINT rlm_run_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.rlm_runs(run_id) ON DELETE CASCADE;


--
-- Name: rlm_upload_chunks rlm_upload_chunks_upload_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rlm_upload_chunks
    ADD CONSTRAINT rlm_upload_chunks_upload_id_fkey FOREIGN KEY (upload_id) REFERENCES public.rlm_uploads(upload_id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--



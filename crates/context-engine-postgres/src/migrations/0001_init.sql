-- context-engine session store on PostgreSQL, schema 1. Same data as the
-- SQLite store (store/migrations/sqlite), plus the versioned session record
-- and claims that several `ctx serve` instances share.

-- Messages are content-addressed: one row per distinct message, shared by
-- every session that archived it. `tsv` indexes the text (words split at
-- every character that is not a letter or digit, as SQLite's FTS5 does).
CREATE TABLE ctx_messages (
    id BIGSERIAL PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,      -- xxh3-128 of the exact JSON, 32 hex digits
    role TEXT NOT NULL,
    json TEXT NOT NULL,             -- the message, byte for byte
    body TEXT NOT NULL,             -- the indexed text, for snippets
    tsv TSVECTOR NOT NULL
);
CREATE INDEX ctx_messages_tsv ON ctx_messages USING GIN (tsv);

-- Which session archived which message, in archive order.
CREATE TABLE ctx_archive (
    session TEXT NOT NULL,
    message BIGINT NOT NULL REFERENCES ctx_messages(id),
    seq BIGINT NOT NULL,
    PRIMARY KEY (session, message)
);
CREATE INDEX ctx_archive_by_seq ON ctx_archive(session, seq);
CREATE INDEX ctx_archive_by_message ON ctx_archive(message);

CREATE TABLE ctx_handles (
    session TEXT NOT NULL,
    handle TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('span', 'message')),
    span_start BIGINT,
    span_end BIGINT,
    PRIMARY KEY (session, handle)
);
CREATE INDEX ctx_handles_by_handle ON ctx_handles(handle);

CREATE TABLE ctx_handle_members (
    session TEXT NOT NULL,
    handle TEXT NOT NULL,
    pos INTEGER NOT NULL,
    message BIGINT NOT NULL REFERENCES ctx_messages(id),
    PRIMARY KEY (session, handle, pos),
    FOREIGN KEY (session, handle) REFERENCES ctx_handles(session, handle)
);
CREATE INDEX ctx_handle_members_by_message ON ctx_handle_members(message);

CREATE TABLE ctx_compactions (
    session TEXT NOT NULL,
    seq BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    trigger TEXT NOT NULL,
    engine TEXT NOT NULL,
    summarizer TEXT,
    handle TEXT NOT NULL,
    span_start BIGINT NOT NULL,
    span_end BIGINT NOT NULL,
    archived BIGINT NOT NULL,
    summary TEXT NOT NULL,          -- JSON array of message hashes
    tokens_before BIGINT NOT NULL,
    tokens_after BIGINT NOT NULL,
    PRIMARY KEY (session, seq)
);

-- The session's record: engine and host state, the server's managed
-- history, and the version every write bumps (compare-and-swap).
CREATE TABLE ctx_state (
    session TEXT PRIMARY KEY,
    version BIGINT NOT NULL,
    state TEXT NOT NULL,
    history TEXT,
    updated_ms BIGINT NOT NULL
);

-- Claims on background jobs (a summary): one owner until it expires, by
-- the database's clock so instances with skewed clocks agree.
CREATE TABLE ctx_claims (
    session TEXT NOT NULL,
    job TEXT NOT NULL,
    owner TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session, job)
);

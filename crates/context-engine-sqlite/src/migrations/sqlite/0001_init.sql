-- context-engine session store, schema 1.
-- Messages are content-addressed: one row per distinct message, shared by
-- every session that archived it.
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,     -- xxh3-128 of the exact JSON, 32 hex digits
    role TEXT NOT NULL,
    json TEXT NOT NULL             -- the message, byte for byte
);

-- Which session archived which message, in archive order.
CREATE TABLE archive (
    session TEXT NOT NULL,
    message INTEGER NOT NULL REFERENCES messages(id),
    seq INTEGER NOT NULL,
    PRIMARY KEY (session, message)
) WITHOUT ROWID;
CREATE INDEX archive_by_seq ON archive(session, seq);
CREATE INDEX archive_by_message ON archive(message);

-- Handles: spans a summary replaced, tool results by their recall handle,
-- single messages by their m… handle.
CREATE TABLE handles (
    session TEXT NOT NULL,
    handle TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('span', 'message')),
    span_start INTEGER,
    span_end INTEGER,
    PRIMARY KEY (session, handle)
) WITHOUT ROWID;
CREATE INDEX handles_by_handle ON handles(handle);

CREATE TABLE handle_members (
    session TEXT NOT NULL,
    handle TEXT NOT NULL,
    pos INTEGER NOT NULL,
    message INTEGER NOT NULL REFERENCES messages(id),
    PRIMARY KEY (session, handle, pos),
    FOREIGN KEY (session, handle) REFERENCES handles(session, handle)
) WITHOUT ROWID;
CREATE INDEX handle_members_by_message ON handle_members(message);

-- One row per compaction: which input span became which summary.
CREATE TABLE compactions (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    trigger TEXT NOT NULL,
    engine TEXT NOT NULL,
    summarizer TEXT,
    handle TEXT NOT NULL,
    span_start INTEGER NOT NULL,
    span_end INTEGER NOT NULL,
    archived INTEGER NOT NULL,
    summary TEXT NOT NULL,         -- JSON array of message hashes
    tokens_before INTEGER NOT NULL,
    tokens_after INTEGER NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;

-- The engine and host state after the last committed step.
CREATE TABLE state (
    session TEXT PRIMARY KEY,
    json TEXT NOT NULL,
    updated_ms INTEGER NOT NULL
) WITHOUT ROWID;

-- Full-text index over archived text; rowid = messages.id. Contentless:
-- the text is in messages.json already, so the index adds only itself.
CREATE VIRTUAL TABLE message_fts USING fts5(text, content = '', contentless_delete = 1);

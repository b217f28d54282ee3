-- context-engine session store, schema 5: the full-text index per session.
-- A search reads only the caller's session, inside the index: every
-- archive row is a document of its own, numbered
-- (the session's number << 32) | its seq, so one session's documents are
-- one rowid range, and the full-text query is restricted to that range
-- (FTS5 seeks each term's doclist to it), whatever other sessions hold.
-- Each token of a document is indexed with its session's mark (`s{n}x`,
-- sqlite/index.rs: session_text), and so is each token of a query: every
-- term belongs to one session, so a query reads only its session's
-- doclists. A message two sessions archived is a document in each.
CREATE TABLE search_sessions (
    no INTEGER PRIMARY KEY,        -- the high 32 bits of its documents
    session TEXT NOT NULL UNIQUE
);

-- Archive rows not in the index yet: the document and its message. The
-- writer indexes them a batch at a time; a search scans its own.
CREATE TABLE search_pending (
    doc INTEGER PRIMARY KEY,
    message INTEGER NOT NULL REFERENCES messages(id)
);

-- Contentless, as message_fts was: the text is in messages.json already.
CREATE VIRTUAL TABLE archive_fts USING fts5(text, content = '', contentless_delete = 1);
INSERT INTO archive_fts (archive_fts, rank) VALUES ('automerge', 0);

-- What schema 4 archived waits for the index (the next writer to open the
-- file indexes it, before any request).
INSERT INTO search_sessions (session) SELECT DISTINCT session FROM archive ORDER BY session;
INSERT INTO search_pending (doc, message)
    SELECT (s.no << 32) | a.seq, a.message
    FROM archive a JOIN search_sessions s ON s.session = a.session;

DROP TABLE message_fts;

-- context-engine session store on PostgreSQL, schema 2: a session's managed
-- history as append-only segments (a step writes what changed since the
-- version it read, not the whole history). A history written as one text by
-- schema 1 becomes the session's first segment: the segment format reads it
-- unchanged.
CREATE TABLE ctx_history (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,           -- position in the history, from 0
    segment TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);

INSERT INTO ctx_history (session, seq, segment)
    SELECT session, 0, history FROM ctx_state WHERE history IS NOT NULL;

ALTER TABLE ctx_state DROP COLUMN history;

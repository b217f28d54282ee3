-- context-engine session store, schema 4: a server's session record keeps
-- its version in a column (one indexed read tells whether a cached copy is
-- current) and its managed history as append-only segments, so a step
-- writes what changed, not the whole history. A history written as one
-- text by schema 3 becomes the session's first segment (the segment format
-- reads it unchanged); the copy left in `state.json` is ignored and dropped
-- at the session's next write.
ALTER TABLE state ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
UPDATE state SET version = json_extract(json, '$.versioned')
    WHERE json_valid(json) AND json_type(json, '$.versioned') = 'integer';

CREATE TABLE history (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,          -- position in the history, from 0
    segment TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;

INSERT INTO history (session, seq, segment)
    SELECT session, 0, json_extract(json, '$.history') FROM state
    WHERE json_valid(json) AND json_type(json, '$.history') = 'text';

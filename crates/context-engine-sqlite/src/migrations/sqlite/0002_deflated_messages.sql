-- context-engine session store, schema 2.
-- messages.json may now hold a BLOB: the message's JSON as raw DEFLATE
-- (what the file keeps for any message of 200 bytes or more that deflate
-- shrinks). A TEXT value is still the JSON itself, so schema 1 rows read
-- unchanged; a program that knows only schema 1 must not read BLOBs, which
-- is what the version number tells it.
INSERT INTO message_fts (message_fts, rank) VALUES ('automerge', 0);

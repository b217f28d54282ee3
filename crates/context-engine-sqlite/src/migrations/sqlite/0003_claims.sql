-- context-engine session store, schema 3: claims on background jobs.
-- A claim is held by one owner (a server instance) until it expires, so two
-- servers never compute the same job (a background summary) of a session.
CREATE TABLE claims (
    session TEXT NOT NULL,
    job TEXT NOT NULL,
    owner TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (session, job)
) WITHOUT ROWID;

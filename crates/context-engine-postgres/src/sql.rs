//! The statements of the request path: the versioned record's
//! compare-and-swap and read, and the array inserts a batch is written with.

/// The compare-and-swap of a session's record and its history in one
/// statement (one round trip, atomic): `$1` session, `$2` new version,
/// `$3` state, `$4` time, `$5` expected version, `$6` segments kept, `$7`
/// segments appended, `$8` whether the history is written. The history is
/// touched only when the swap took (`swap` joined); rows replaced in place
/// and rows past the new end deleted are disjoint, so no row is touched
/// twice. Answers 1 when the swap took.
pub(crate) const SWAP_TAIL: &str = "\
    cut AS (DELETE FROM ctx_history h USING swap \
            WHERE $8 AND h.session = swap.session AND h.seq >= $6::INTEGER + cardinality($7::TEXT[])), \
    put AS (INSERT INTO ctx_history (session, seq, segment) \
            SELECT swap.session, $6::INTEGER + t.o::INTEGER - 1, t.s \
            FROM swap, unnest($7::TEXT[]) WITH ORDINALITY AS t(s, o) WHERE $8 \
            ON CONFLICT (session, seq) DO UPDATE SET segment = excluded.segment) \
    SELECT count(*) FROM swap";

/// [`SWAP_TAIL`] for a record that exists (`version = $5`).
pub(crate) fn swap_update() -> String {
    format!(
        "WITH swap AS (UPDATE ctx_state SET version = $2, state = $3, updated_ms = $4 \
           WHERE session = $1 AND version = $5 RETURNING session), {SWAP_TAIL}"
    )
}

/// [`SWAP_TAIL`] for a new record (or one at version 0).
pub(crate) fn swap_insert() -> String {
    format!(
        "WITH swap AS (INSERT INTO ctx_state (session, version, state, updated_ms) \
           VALUES ($1, $2, $3, $4) \
           ON CONFLICT (session) DO UPDATE SET version = excluded.version, state = excluded.state, \
             updated_ms = excluded.updated_ms \
           WHERE ctx_state.version = $5 RETURNING session), {SWAP_TAIL}"
    )
}

/// A session's record in one read, unless its version is `$2` (-1: none
/// known). `$3` is how many history segments the reader holds: when at
/// least that many are stored, only the ones after them come back (from
/// `$3`; the reader checks that the ones it holds are still the stored
/// ones, see [`Since::Appended`]); else all of them (from 0).
pub(crate) const LOAD_AFTER: &str = "SELECT version, \
       CASE WHEN version <> $2 THEN state END, \
       CASE WHEN version <> $2 THEN b.f END, \
       CASE WHEN version <> $2 THEN \
         ARRAY(SELECT segment FROM ctx_history h WHERE h.session = s.session AND h.seq >= b.f \
               ORDER BY seq) END \
     FROM ctx_state s, LATERAL (SELECT CASE WHEN $3 > 0 AND (SELECT count(*) FROM ctx_history h \
         WHERE h.session = s.session) >= $3 THEN $3 ELSE 0 END AS f) b \
     WHERE session = $1";

/// A session's record version.
pub(crate) const VERSION: &str = "SELECT version FROM ctx_state WHERE session = $1";

/// A batch's messages, content-addressed (a message archived before, by
/// any session, is kept once), inserted in hash order so that two
/// transactions archiving the same messages take their locks in the same
/// order. `$1`..`$5`: hashes, roles, JSON, indexed text, its words.
pub(crate) const INSERT_MESSAGES: &str = "\
    INSERT INTO ctx_messages (hash, role, json, body, tsv) \
    SELECT t.hash, t.role, t.json, t.body, to_tsvector('simple', t.words) \
    FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[]) AS t(hash, role, json, body, words) \
    ORDER BY t.hash \
    ON CONFLICT (hash) DO NOTHING";

/// The session's archive rows for `$2` (hashes, in archive order), after
/// what it archived before (a separate statement: it sees the messages
/// [`INSERT_MESSAGES`] wrote, and those another transaction committed
/// meanwhile). A message archived before keeps its place.
pub(crate) const INSERT_ARCHIVE: &str = "\
    INSERT INTO ctx_archive (session, message, seq) \
    SELECT $1, m.id, base.n + t.o \
    FROM unnest($2::TEXT[]) WITH ORDINALITY AS t(hash, o) \
    JOIN ctx_messages m ON m.hash = t.hash \
    CROSS JOIN (SELECT COALESCE(MAX(seq), 0) AS n FROM ctx_archive WHERE session = $1) base \
    ORDER BY t.o \
    ON CONFLICT DO NOTHING";

/// Handles (`$2`..`$5`) and their members (`$6`..`$8`: handle, position,
/// message hash): the first registration of a handle wins, so members are
/// written only for the handles this statement added. Answers the members
/// wanted and written (a difference: a member names a message that is
/// not archived).
pub(crate) const INSERT_HANDLES: &str = "\
    WITH added AS (INSERT INTO ctx_handles (session, handle, kind, span_start, span_end) \
        SELECT $1, t.handle, t.kind, t.s, t.e \
        FROM unnest($2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[]) AS t(handle, kind, s, e) \
        ON CONFLICT DO NOTHING RETURNING handle), \
    wanted AS (SELECT p.handle, p.pos, p.hash \
        FROM unnest($6::TEXT[], $7::INTEGER[], $8::TEXT[]) AS p(handle, pos, hash) \
        JOIN added a ON a.handle = p.handle), \
    put AS (INSERT INTO ctx_handle_members (session, handle, pos, message) \
        SELECT $1, w.handle, w.pos, m.id FROM wanted w JOIN ctx_messages m ON m.hash = w.hash \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM wanted), (SELECT count(*) FROM put)";

/// Compaction records, one per array element.
pub(crate) const INSERT_COMPACTIONS: &str = "\
    INSERT INTO ctx_compactions (session, seq, created_ms, trigger, engine, summarizer, \
      handle, span_start, span_end, archived, summary, tokens_before, tokens_after) \
    SELECT $1, t.* FROM unnest($2::BIGINT[], $3::BIGINT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], \
      $7::TEXT[], $8::BIGINT[], $9::BIGINT[], $10::BIGINT[], $11::TEXT[], $12::BIGINT[], $13::BIGINT[]) AS t";

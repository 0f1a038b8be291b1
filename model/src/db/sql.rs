//! The SQL text of every statement Pelican runs, each beside the [`Db`]
//! method that is its reference twin. Times are milliseconds (`bigint`) passed
//! by the caller, as in the model, so that no statement reads the server's
//! clock.
//!
//! [`Db`]: super::Db

/// The schema, version 1 (`pelican migrate`; see [`SCHEMA_HOT_PATH`] for
/// version 2). Applied migrations are checksummed: never edit it, add one.
pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS runs (
    run_id        bigint PRIMARY KEY,
    kind          text    NOT NULL,
    input         text    NOT NULL,
    status        text    NOT NULL CHECK (status IN
                  ('queued','running','retry_wait','succeeded','failed','cancelled','dead')),
    dispatch      integer NOT NULL,
    active_fence  bigint  NOT NULL,
    attempts      integer NOT NULL,
    attempts_max  integer NOT NULL,
    lease_until   bigint,
    retry_at      bigint,
    published_at  bigint,
    entry_id      text,
    result        text,
    error_class   text,
    error_message text
);
CREATE INDEX IF NOT EXISTS runs_outbox ON runs (run_id) WHERE status = 'queued' AND published_at IS NULL;
CREATE INDEX IF NOT EXISTS runs_retry ON runs (retry_at) WHERE status = 'retry_wait';
CREATE INDEX IF NOT EXISTS runs_entry ON runs (entry_id);
CREATE TABLE IF NOT EXISTS attempts (
    run_id   bigint  NOT NULL REFERENCES runs (run_id),
    attempt  integer NOT NULL,
    fence    bigint  NOT NULL,
    worker   text    NOT NULL,
    entry_id text    NOT NULL,
    dispatch integer NOT NULL,
    outcome  text,
    PRIMARY KEY (run_id, attempt)
);
CREATE TABLE IF NOT EXISTS dead_letters (
    run_id       bigint PRIMARY KEY REFERENCES runs (run_id),
    source_entry text,
    class        text   NOT NULL,
    message      text   NOT NULL,
    attempts     jsonb  NOT NULL,
    requeued     boolean NOT NULL DEFAULT false
);
CREATE SEQUENCE IF NOT EXISTS run_ids;
CREATE TABLE IF NOT EXISTS effects (
    key      text   PRIMARY KEY,
    requests bigint NOT NULL
);
"#;

/// Migration 2: the hot path's updates made HOT, and a redundant key check
/// dropped (`pelican migrate` applies [`SCHEMA`] as version 1, this as 2).
///
/// A claim and an outcome update each run once, an outcome its attempt once.
/// In version 1, `status` sat in the predicates of two partial indexes, so
/// every such update wrote a new entry in every index of the table. Now no
/// index covers, or has a predicate on, a column those updates change
/// (`status`, `active_fence`, `attempts`, `lease_until`, `result`,
/// `outcome`): the outbox and retry indexes are keyed on the nullness of
/// `published_at` and `retry_at`, which the hot path leaves alone (a claim
/// writes NULL over NULL and `entry_id` over the same ID; an unchanged value
/// does not break HOT), and the fill factors leave each page room for the
/// new versions. The queries that use these indexes ([`UNPUBLISHED`],
/// [`PROMOTE_RETRIES`]) filter on `status` themselves.
///
/// `attempts.run_id` loses its foreign key: an attempt row is only ever
/// inserted by a claim, from the `runs` row that claim has just updated (and
/// holds locked), and no run is ever deleted. Its check, a `FOR KEY SHARE`
/// lookup per inserted row, was a third of a batched claim's time under
/// `EXPLAIN ANALYZE`.
pub const SCHEMA_HOT_PATH: &str = r#"
ALTER TABLE runs SET (fillfactor = 50);
ALTER TABLE attempts SET (fillfactor = 50);
DROP INDEX IF EXISTS runs_outbox;
DROP INDEX IF EXISTS runs_retry;
CREATE INDEX IF NOT EXISTS runs_unpublished ON runs (run_id) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS runs_retry_due ON runs (retry_at) WHERE retry_at IS NOT NULL;
ALTER TABLE attempts DROP CONSTRAINT IF EXISTS attempts_run_id_fkey;
"#;

/// [`super::Db::insert_run`]: `$1` run, `$2` kind, `$3` input, `$4` attempts_max.
pub const INSERT_RUN: &str = "INSERT INTO runs (run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max) \
     VALUES ($1, $2, $3, 'queued', 1, 0, 0, $4) ON CONFLICT (run_id) DO NOTHING";

/// [`super::Db::mark_published`]: `$1` run, `$2` dispatch, `$3` entry, `$4` now.
pub const MARK_PUBLISHED: &str = "UPDATE runs SET published_at = $4, entry_id = $3 \
     WHERE run_id = $1 AND dispatch = $2 AND status = 'queued'";

/// [`super::Db::claim`]: `$1` run, `$2` dispatch, `$3` entry, `$4` worker,
/// `$5` now, `$6` lease_ms. Returns the new fence, attempt number and attempts_max.
pub const CLAIM: &str = "WITH claimed AS ( \
       UPDATE runs SET status = 'running', active_fence = active_fence + 1, attempts = attempts + 1, \
              lease_until = $5 + $6, retry_at = NULL, entry_id = $3 \
        WHERE run_id = $1 AND dispatch = $2 AND attempts < attempts_max \
          AND (status = 'queued' OR (status = 'running' AND lease_until <= $5)) \
       RETURNING run_id, active_fence, attempts, attempts_max, dispatch, kind, input), \
     recorded AS (INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch) \
       SELECT run_id, attempts, active_fence, $4, $3, dispatch FROM claimed) \
     SELECT active_fence, attempts, attempts_max, kind, input FROM claimed";

/// [`super::Db::execute_batch`] of [`CLAIM`]s on distinct runs, in one
/// statement: `$1` runs, `$2` dispatches, `$3` entries, `$4` workers,
/// `$5` nows, `$6` lease lengths (arrays, one element per claim). Answers one
/// row per claim that took, with its `run_id`.
pub const CLAIM_MANY: &str = "WITH input AS ( \
       SELECT * FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) \
         AS i(run_id, dispatch, entry_id, worker, now, lease_ms)), \
     claimed AS ( \
       UPDATE runs r SET status = 'running', active_fence = r.active_fence + 1, attempts = r.attempts + 1, \
              lease_until = i.now + i.lease_ms, retry_at = NULL, entry_id = i.entry_id \
         FROM input i \
        WHERE r.run_id = i.run_id AND r.dispatch = i.dispatch AND r.attempts < r.attempts_max \
          AND (r.status = 'queued' OR (r.status = 'running' AND r.lease_until <= i.now)) \
       RETURNING r.run_id, r.active_fence, r.attempts, r.attempts_max, r.dispatch, r.kind, r.input, \
                 i.entry_id, i.worker), \
     recorded AS (INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch) \
       SELECT run_id, attempts, active_fence, worker, entry_id, dispatch FROM claimed) \
     SELECT run_id, active_fence, attempts, attempts_max, kind, input FROM claimed";

/// [`super::Db::execute_batch`] of [`COMPLETE`]s on distinct runs, in one
/// statement: `$1` runs, `$2` fences, `$3` results (arrays). Answers the
/// `run_id` of each completion that took.
pub const COMPLETE_MANY: &str = "WITH input AS ( \
       SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS i(run_id, fence, result)), \
     done AS ( \
       UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL \
         FROM input i \
        WHERE r.run_id = i.run_id AND r.active_fence = i.fence AND r.status = 'running' \
       RETURNING r.run_id, i.fence), \
     marked AS (UPDATE attempts a SET outcome = 'succeeded' FROM done d \
        WHERE a.run_id = d.run_id AND a.fence = d.fence) \
     SELECT run_id FROM done";

/// [`super::Db::read_run`]: `$1` run.
pub const READ_RUN: &str = "SELECT run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max, \
     lease_until, retry_at, published_at, entry_id, result, error_class, error_message \
     FROM runs WHERE run_id = $1";

/// [`super::Db::heartbeat`]: `$1` run, `$2` fence, `$3` now, `$4` lease_ms.
pub const HEARTBEAT: &str = "UPDATE runs SET lease_until = $3 + $4 \
     WHERE run_id = $1 AND active_fence = $2 AND status = 'running'";

/// [`super::Db::complete`]: `$1` run, `$2` fence, `$3` result.
pub const COMPLETE: &str = "WITH done AS ( \
       UPDATE runs SET status = 'succeeded', result = $3, lease_until = NULL \
        WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id) \
     UPDATE attempts SET outcome = 'succeeded' \
      WHERE run_id IN (SELECT run_id FROM done) AND fence = $2";

/// [`super::Db::fail`]: `$1` run, `$2` fence, `$3` class, `$4` message.
pub const FAIL: &str = "WITH done AS ( \
       UPDATE runs SET status = 'failed', error_class = $3, error_message = $4, lease_until = NULL \
        WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id) \
     UPDATE attempts SET outcome = $3 WHERE run_id IN (SELECT run_id FROM done) AND fence = $2";

/// [`super::Db::schedule_retry`]: `$1` run, `$2` fence, `$3` class,
/// `$4` message, `$5` retry_at.
pub const SCHEDULE_RETRY: &str = "WITH done AS ( \
       UPDATE runs SET status = 'retry_wait', retry_at = $5, dispatch = dispatch + 1, \
              published_at = NULL, lease_until = NULL, error_class = $3, error_message = $4 \
        WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id) \
     UPDATE attempts SET outcome = $3 WHERE run_id IN (SELECT run_id FROM done) AND fence = $2";

/// [`super::Db::dead_letter`]: `$1` run, `$2` fence, `$3` class, `$4` message.
pub const DEAD_LETTER: &str = "WITH done AS ( \
       UPDATE runs SET status = 'dead', error_class = $3, error_message = $4, lease_until = NULL \
        WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id, entry_id), \
     outcome AS (UPDATE attempts SET outcome = $3 WHERE run_id IN (SELECT run_id FROM done) AND fence = $2) \
     INSERT INTO dead_letters (run_id, source_entry, class, message, attempts) \
     SELECT d.run_id, d.entry_id, $3, $4, (SELECT coalesce(jsonb_agg(jsonb_build_array(a.attempt, a.fence, \
            CASE WHEN a.fence = $2 THEN $3 ELSE a.outcome END) ORDER BY a.attempt), '[]') \
            FROM attempts a WHERE a.run_id = d.run_id) FROM done d \
     ON CONFLICT (run_id) DO UPDATE SET source_entry = EXCLUDED.source_entry, class = EXCLUDED.class, \
            message = EXCLUDED.message, attempts = EXCLUDED.attempts, requeued = false";

/// [`super::Db::dead_letter_exhausted`]: `$1` run, `$2` dispatch, `$3` now.
pub const DEAD_LETTER_EXHAUSTED: &str = "WITH done AS ( \
       UPDATE runs SET status = 'dead', error_class = 'exhausted', error_message = 'attempts exhausted', \
              lease_until = NULL \
        WHERE run_id = $1 AND dispatch = $2 AND attempts >= attempts_max \
          AND (status = 'queued' OR (status = 'running' AND lease_until <= $3)) RETURNING run_id, entry_id) \
     INSERT INTO dead_letters (run_id, source_entry, class, message, attempts) \
     SELECT d.run_id, d.entry_id, 'exhausted', 'attempts exhausted', (SELECT coalesce(jsonb_agg( \
            jsonb_build_array(a.attempt, a.fence, a.outcome) ORDER BY a.attempt), '[]') \
            FROM attempts a WHERE a.run_id = d.run_id) FROM done d \
     ON CONFLICT (run_id) DO UPDATE SET source_entry = EXCLUDED.source_entry, class = EXCLUDED.class, \
            message = EXCLUDED.message, attempts = EXCLUDED.attempts, requeued = false";

/// [`super::Db::cancel`]: `$1` run.
pub const CANCEL: &str = "UPDATE runs SET status = 'cancelled', lease_until = NULL, retry_at = NULL \
     WHERE run_id = $1 AND status IN ('queued', 'running', 'retry_wait')";

/// [`super::Db::promote_retries`]: `$1` now, `$2` limit.
pub const PROMOTE_RETRIES: &str = "UPDATE runs SET status = 'queued', retry_at = NULL, published_at = NULL \
     WHERE run_id IN (SELECT run_id FROM runs WHERE status = 'retry_wait' AND retry_at <= $1 \
                      ORDER BY retry_at, run_id LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// [`super::Db::unpublished`]: `$1` limit.
pub const UNPUBLISHED: &str = "SELECT run_id, dispatch, entry_id FROM runs \
     WHERE status = 'queued' AND published_at IS NULL ORDER BY run_id LIMIT $1";

/// [`super::Db::orphan_candidates`]: `$1` cutoff (now - grace_ms), `$2` limit.
pub const ORPHAN_CANDIDATES: &str = "SELECT run_id, dispatch, entry_id FROM runs \
     WHERE (status = 'queued' AND published_at <= $1) OR (status = 'running' AND lease_until <= $1) \
     ORDER BY run_id LIMIT $2";

/// [`super::Db::requeue_run`]: `$1` run, `$2` dispatch, `$3` now.
pub const REQUEUE_RUN: &str = "UPDATE runs SET status = 'queued', dispatch = dispatch + 1, published_at = NULL, \
            lease_until = NULL, retry_at = NULL \
     WHERE run_id = $1 AND dispatch = $2 \
       AND (status = 'queued' OR (status = 'running' AND lease_until <= $3))";

/// [`super::Db::requeue_entry`]: `$1` entry, `$2` now.
pub const REQUEUE_ENTRY: &str = "UPDATE runs SET status = 'queued', dispatch = dispatch + 1, published_at = NULL, \
            lease_until = NULL, retry_at = NULL \
     WHERE entry_id = $1 AND (status = 'queued' OR (status = 'running' AND lease_until <= $2))";

/// [`super::Db::dlq_requeue`]: `$1` run, `$2` extra attempts.
pub const DLQ_REQUEUE: &str = "WITH d AS (UPDATE dead_letters SET requeued = true WHERE run_id = $1 AND NOT requeued \
       RETURNING run_id) \
     UPDATE runs SET status = 'queued', attempts_max = attempts + $2, dispatch = dispatch + 1, \
            published_at = NULL, lease_until = NULL, retry_at = NULL \
     WHERE run_id IN (SELECT run_id FROM d) AND status = 'dead'";

/// [`super::Db::apply_effect`]: `$1` key. Returns whether it was new.
pub const APPLY_EFFECT: &str = "INSERT INTO effects (key, requests) VALUES ($1, 1) \
     ON CONFLICT (key) DO UPDATE SET requests = effects.requests + 1 RETURNING (requests = 1) AS applied";

/// [`super::Db::next_run_id`]: a fresh run id.
pub const NEXT_RUN_ID: &str = "SELECT nextval('run_ids')";

/// [`super::Db::read_attempts`]: `$1` run.
pub const READ_ATTEMPTS: &str = "SELECT attempt, fence, worker, entry_id, dispatch, outcome FROM attempts \
     WHERE run_id = $1 ORDER BY attempt";

/// [`super::Db::list_dead_letters`]: `$1` limit.
pub const LIST_DEAD_LETTERS: &str = "SELECT run_id, source_entry, class, message, attempts, requeued \
     FROM dead_letters ORDER BY run_id LIMIT $1";

/// [`super::Db::count_runs`].
pub const COUNT_RUNS: &str =
    "SELECT status, count(*) AS n FROM runs GROUP BY status ORDER BY status";

/// Mutant twin of [`CLAIM`] (`ReviveCancelled`): also takes over cancelled runs.
pub const CLAIM_REVIVING: &str = "WITH claimed AS ( \
       UPDATE runs SET status = 'running', active_fence = active_fence + 1, attempts = attempts + 1, \
              lease_until = $5 + $6, retry_at = NULL, entry_id = $3 \
        WHERE run_id = $1 AND attempts < attempts_max \
          AND (status = 'cancelled' OR (dispatch = $2 \
               AND (status = 'queued' OR (status = 'running' AND lease_until <= $5)))) \
       RETURNING run_id, active_fence, attempts, attempts_max, dispatch, kind, input), \
     recorded AS (INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch) \
       SELECT run_id, attempts, active_fence, $4, $3, dispatch FROM claimed) \
     SELECT active_fence, attempts, attempts_max, kind, input FROM claimed";

/// Mutant twin (`RetryInPel`): `$1` run, `$2` fence, `$3` class, `$4` message.
pub const RECORD_FAILURE_ONLY: &str = "WITH done AS ( \
       UPDATE runs SET error_class = $3, error_message = $4 \
        WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id) \
     UPDATE attempts SET outcome = $3 WHERE run_id IN (SELECT run_id FROM done) AND fence = $2";

/// Baseline twin (`Unguarded`) of [`COMPLETE`]: `$1` run, `$2` result. No
/// fence and no attempt record: any run not yet terminal succeeds.
pub const COMPLETE_UNFENCED: &str = "UPDATE runs SET status = 'succeeded', result = $2, lease_until = NULL \
     WHERE run_id = $1 AND status IN ('queued', 'running', 'retry_wait')";

/// Baseline twin (`Unguarded`) of [`FAIL`]: `$1` run, `$2` class,
/// `$3` message. No fence and no attempt record.
pub const FAIL_UNFENCED: &str = "UPDATE runs SET status = 'failed', error_class = $2, error_message = $3, \
            lease_until = NULL \
     WHERE run_id = $1 AND status IN ('queued', 'running', 'retry_wait')";

/// [`super::Db::execute_batch`] of [`READ_RUN`]s, in one statement: `$1`
/// runs (they may repeat). Answers the row of each run that exists. Reads
/// follow refused claims and rejected writes, and they are the first step
/// of every delivery of the benchmarks' baseline (`Unguarded`).
pub const READ_RUN_MANY: &str = "SELECT run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max, \
     lease_until, retry_at, published_at, entry_id, result, error_class, error_message \
     FROM runs WHERE run_id = ANY($1::bigint[])";

/// [`super::Db::execute_batch`] of [`COMPLETE_UNFENCED`]s on distinct runs,
/// in one statement (`Unguarded`): `$1` runs, `$2` results (arrays).
/// Answers the `run_id` of each result that took.
pub const COMPLETE_UNFENCED_MANY: &str = "WITH input AS ( \
       SELECT * FROM unnest($1::bigint[], $2::text[]) AS i(run_id, result)) \
     UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL \
       FROM input i \
      WHERE r.run_id = i.run_id AND r.status IN ('queued', 'running', 'retry_wait') \
     RETURNING r.run_id";

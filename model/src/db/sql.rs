//! The schema Pelican's statements run against, as migrations. The
//! statements themselves are declared in [`super::Statement`].

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
/// new versions. The queries that use these indexes ([`ClaimOutbox`],
/// [`PromoteRetries`]) filter on `status` themselves.
///
/// `attempts.run_id` loses its foreign key: an attempt row is only ever
/// inserted by a claim, from the `runs` row that claim has just updated (and
/// holds locked), and no run is ever deleted. Its check, a `FOR KEY SHARE`
/// lookup per inserted row, was a third of a batched claim's time under
/// `EXPLAIN ANALYZE`.
///
/// [`ClaimOutbox`]: super::Statement::ClaimOutbox
/// [`PromoteRetries`]: super::Statement::PromoteRetries
pub const SCHEMA_HOT_PATH: &str = r#"
ALTER TABLE runs SET (fillfactor = 50);
ALTER TABLE attempts SET (fillfactor = 50);
DROP INDEX IF EXISTS runs_outbox;
DROP INDEX IF EXISTS runs_retry;
CREATE INDEX IF NOT EXISTS runs_unpublished ON runs (run_id) WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS runs_retry_due ON runs (retry_at) WHERE retry_at IS NOT NULL;
ALTER TABLE attempts DROP CONSTRAINT IF EXISTS attempts_run_id_fkey;
"#;

/// Migration 3: clients' idempotency keys for submissions
/// ([`InsertRunKeyed`]), kept until [`ExpireKeys`] forgets them. `request`
/// is the request the key was first used with ([`SubmitKey::request`]).
///
/// [`SubmitKey::request`]: super::SubmitKey::request
///
/// [`InsertRunKeyed`]: super::Statement::InsertRunKeyed
/// [`ExpireKeys`]: super::Statement::ExpireKeys
pub const SCHEMA_SUBMIT_KEYS: &str = r#"
CREATE TABLE IF NOT EXISTS submit_keys (
    key        text   PRIMARY KEY,
    run_id     bigint NOT NULL,
    request    text   NOT NULL,
    created_at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS submit_keys_created ON submit_keys (created_at);
"#;

/// Migration 4: one clock for every statement. `pelican_now_ms()` is
/// Postgres's clock when the statement started, in milliseconds since the
/// epoch; leases, retries and publication times are stored and compared in
/// it, so a worker whose clock is off cannot take a live lease. A session
/// may pin it with `SET pelican.now_ms = N` (the conformance suite does, to
/// run the model beside Postgres on the same clock); Pelican's own sessions
/// never do.
pub const SCHEMA_ONE_CLOCK: &str = r#"
CREATE OR REPLACE FUNCTION pelican_now_ms() RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT coalesce(nullif(current_setting('pelican.now_ms', true), '')::bigint,
                  (extract(epoch FROM statement_timestamp()) * 1000)::bigint)
$$;
"#;

/// Migration 5: the worker registry. A worker started without `--id` takes
/// the next number here ([`RegisterWorker`]), so no two workers anywhere
/// share a consumer name; the row says which host and process it is.
///
/// [`RegisterWorker`]: super::Statement::RegisterWorker
pub const SCHEMA_WORKERS: &str = r#"
CREATE TABLE IF NOT EXISTS workers (
    worker_id  integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    host       text    NOT NULL,
    pid        integer NOT NULL,
    started_at bigint  NOT NULL
);
"#;

/// Migration 6: live runs apart from finished ones, and retention.
///
/// * `finished_at` is when a run became terminal. The live runs are those
///   without one (`runs_live`): the sweeper and `/metrics` read that index
///   and never scan finished runs. A claim and a heartbeat leave the column
///   alone, so they stay HOT; the one write that finishes a run moves it out
///   (not HOT: its new version enters `runs_pkey` and `runs_finished`).
///   The entry index holds live runs only (`runs_entry_live`; only
///   [`RequeueEntry`] reads it), so finishing a run adds nothing to it.
/// * `published_at` is set once a run leaves `queued` ([`Claim`], the
///   terminal writes) and no longer cleared by [`ScheduleRetry`] (a promotion
///   sets it anew, taking the run for publication, since schema 17's code;
///   it cleared it before): `runs_unpublished` holds only the outbox's work.
/// * [`DeleteFinished`] takes the oldest finished runs by `runs_finished`,
///   and their submit keys by run.
///
/// Existing rows are brought to the same rules; finished runs count from
/// now, so retention spares them one window.
///
/// [`Claim`]: super::Statement::Claim
/// [`ScheduleRetry`]: super::Statement::ScheduleRetry
/// [`DeleteFinished`]: super::Statement::DeleteFinished
/// [`RequeueEntry`]: super::Statement::RequeueEntry
pub const SCHEMA_LIVE: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS finished_at bigint;
UPDATE runs SET finished_at = pelican_now_ms()
 WHERE finished_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled', 'dead');
UPDATE runs SET published_at = pelican_now_ms() WHERE published_at IS NULL AND status <> 'queued';
CREATE INDEX IF NOT EXISTS runs_live ON runs (run_id) WHERE finished_at IS NULL;
DROP INDEX IF EXISTS runs_entry;
CREATE INDEX IF NOT EXISTS runs_entry_live ON runs (entry_id) WHERE finished_at IS NULL;
CREATE INDEX IF NOT EXISTS runs_finished ON runs (finished_at, run_id) WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS submit_keys_run ON submit_keys (run_id);
"#;

/// Migration 7: the execution ledger. One row per recorded step of a run:
/// its index in the order the job asked for steps, its name, its output
/// (JSON text) and the fence of the attempt that recorded it. A row is
/// never replaced ([`RecordStep`]); retention deletes it with its run.
///
/// [`RecordStep`]: super::Statement::RecordStep
pub const SCHEMA_STEPS: &str = r#"
CREATE TABLE IF NOT EXISTS steps (
    run_id bigint NOT NULL,
    step integer NOT NULL,
    name text NOT NULL,
    output text NOT NULL,
    fence bigint NOT NULL,
    PRIMARY KEY (run_id, step)
);
"#;

/// Migration 8: the retry policy. `unknown_failures` counts the retries a
/// run has had after errors of class `unknown`; [`ScheduleRetry`] counts
/// them, and a claim answers the count, so that the delivery can fail the
/// run once the policy's cap is reached.
///
/// [`ScheduleRetry`]: super::Statement::ScheduleRetry
pub const SCHEMA_RETRY_POLICY: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS unknown_failures integer NOT NULL DEFAULT 0;
"#;

/// Migration 9: elapsed budgets. `deadline_ms` is when a run's kind's
/// budget runs out, stamped by Postgres's clock at insert (NULL: no
/// budget); a claim answers what is left of it, by the same clock.
pub const SCHEMA_BUDGET: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS deadline_ms bigint;
"#;

/// Migration 10: per-provider limits, shared by every worker. A provider's
/// concurrency limit is its slots (`provider_slots`, one row per slot, held
/// until `until_ms` by the permit named `holder`); its rate limit is one
/// row of GCRA state (`provider_rates.tat_ms`: the theoretical arrival time
/// of the next request), both by Postgres's clock.
pub const SCHEMA_LIMITS: &str = r#"
CREATE TABLE IF NOT EXISTS provider_slots (
    provider text NOT NULL,
    slot integer NOT NULL,
    holder text NOT NULL DEFAULT '',
    until_ms bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, slot)
);
CREATE TABLE IF NOT EXISTS provider_rates (
    provider text PRIMARY KEY,
    tat_ms bigint NOT NULL
);
"#;

/// Migration 11: each run's events ([`crate::events`]). `runs.events` is
/// the number of the run's latest event, 1 for its `queued` event, so
/// every run starts with one; the statement that writes an event takes the
/// next number from it under the row's lock. A claim's event and a
/// success's are their attempt's row (`claimed_seq`, `outcome_seq`: the
/// hot path writes no row of its own for them; since migration 14 a
/// success is the run's row alone); the others are rows of
/// `run_events`. Attempts claimed before this migration have no event: the
/// log of a run from before it goes on from event 1.
pub const SCHEMA_EVENTS: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS events integer NOT NULL DEFAULT 1;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS claimed_seq integer;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS outcome_seq integer;
CREATE TABLE IF NOT EXISTS run_events (
    run_id  bigint  NOT NULL,
    seq     integer NOT NULL,
    kind    text    NOT NULL,
    attempt integer NOT NULL,
    fence   bigint  NOT NULL,
    class   text,
    data    text    NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"#;

/// Migration 12: the sweeper's index. [`OrphanCandidates`] walks live runs
/// by (`published_at`, `run_id`) up to its cutoff, so a backlog queued
/// within the grace costs it nothing (it read every live run before: 172 ms
/// with a million queued). A claim leaves `published_at` as it was (set
/// already), and finishing a run is not HOT anyway, so the hot path's
/// updates stay HOT and finishing adds no entry here.
///
/// [`OrphanCandidates`]: super::Statement::OrphanCandidates
pub const SCHEMA_SWEEP: &str = r#"
CREATE INDEX IF NOT EXISTS runs_sweep ON runs (published_at, run_id) WHERE finished_at IS NULL;
"#;

/// Migration 13: live runs counted as they change, so that
/// [`CountLive`] (`GET /metrics`, `GET /queue`) reads a few rows instead
/// of every live run (123 ms with a million queued).
///
/// Statement-level triggers on `runs` add each statement's change to the
/// number of live runs (`finished_at IS NULL`) per status, computed from
/// its transition tables, into `run_count_deltas` rows of the statement's
/// own server process (`pg_backend_pid()`). A process runs one transaction
/// at a time, so no writer waits on another's counter row, and each row is
/// updated in place (HOT), so the table stays a few pages however many
/// statements run. Every 64th changing statement, if it takes the fold's
/// advisory lock without waiting (one folder at a time, holding it to its
/// commit), moves its own rows and those of processes that have exited
/// into `run_counts`, skipping rows another transaction holds: the table
/// stays as large as the live processes. A reader sums both tables in one
/// snapshot, which sees the `runs` changes of exactly the transactions
/// whose counts it sees: the sum is the count a scan would give in the same
/// snapshot. The conformance suites compare it with the model's scan after
/// every sequence and race.
///
/// The migration locks `runs` against writers while it counts the live
/// runs once and installs the triggers. TRUNCATE empties both tables.
///
/// [`CountLive`]: super::Statement::CountLive
pub const SCHEMA_COUNTS: &str = r#"
LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE;
CREATE TABLE IF NOT EXISTS run_counts (
    status text PRIMARY KEY,
    n      bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS run_count_deltas (
    backend integer NOT NULL,
    status  text    NOT NULL,
    n       bigint  NOT NULL,
    PRIMARY KEY (backend, status)
) WITH (fillfactor = 20);
CREATE SEQUENCE IF NOT EXISTS run_count_statements CACHE 64;
INSERT INTO run_counts (status, n)
SELECT status, count(*) FROM runs WHERE finished_at IS NULL GROUP BY status;
CREATE OR REPLACE FUNCTION pelican_count_live() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO run_count_deltas AS d (backend, status, n)
        SELECT pg_backend_pid(), status, count(*)
        FROM counted_new WHERE finished_at IS NULL GROUP BY status
        ON CONFLICT (backend, status) DO UPDATE SET n = d.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO run_count_deltas AS d (backend, status, n)
        SELECT pg_backend_pid(), status, -count(*)
        FROM counted_old WHERE finished_at IS NULL GROUP BY status
        ON CONFLICT (backend, status) DO UPDATE SET n = d.n + excluded.n;
    ELSE
        INSERT INTO run_count_deltas AS d (backend, status, n)
        SELECT pg_backend_pid(), status, sum(c.d) FROM (
            SELECT status, 1 AS d FROM counted_new WHERE finished_at IS NULL
            UNION ALL
            SELECT status, -1 FROM counted_old WHERE finished_at IS NULL
        ) c GROUP BY status HAVING sum(c.d) <> 0
        ON CONFLICT (backend, status) DO UPDATE SET n = d.n + excluded.n;
    END IF;
    GET DIAGNOSTICS changed = ROW_COUNT;
    IF changed > 0 AND nextval('run_count_statements') % 64 = 0
       AND pg_try_advisory_xact_lock(8107251139265355333) THEN
        PERFORM pg_stat_clear_snapshot();
        WITH gone AS (
            SELECT backend, status, n, backend = pg_backend_pid() AS mine
            FROM run_count_deltas
            WHERE (backend = pg_backend_pid() AND n <> 0)
               OR backend NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
            FOR UPDATE SKIP LOCKED
        ), zeroed AS (
            UPDATE run_count_deltas d SET n = 0 FROM gone
            WHERE gone.mine AND d.backend = gone.backend AND d.status = gone.status
        ), dropped AS (
            DELETE FROM run_count_deltas d USING gone
            WHERE NOT gone.mine AND d.backend = gone.backend AND d.status = gone.status
        )
        INSERT INTO run_counts (status, n)
        SELECT status, sum(n) FROM gone GROUP BY status ORDER BY status
        ON CONFLICT (status) DO UPDATE SET n = run_counts.n + excluded.n;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION pelican_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE run_counts, run_count_deltas;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER runs_count_insert AFTER INSERT ON runs
    REFERENCING NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION pelican_count_live();
CREATE OR REPLACE TRIGGER runs_count_update AFTER UPDATE ON runs
    REFERENCING OLD TABLE AS counted_old NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION pelican_count_live();
CREATE OR REPLACE TRIGGER runs_count_delete AFTER DELETE ON runs
    REFERENCING OLD TABLE AS counted_old
    FOR EACH STATEMENT EXECUTE FUNCTION pelican_count_live();
CREATE OR REPLACE TRIGGER runs_count_truncate AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION pelican_count_truncate();
"#;

/// Migration 14: a success recorded on the run's row alone. The hot path's
/// completion ([`Complete`]) wrote the run's row and then its attempt's
/// (`outcome`, `outcome_seq`), an `UPDATE` of a row its claim had just
/// inserted. A success is a run's last write and a succeeded run's fence
/// never changes again, so the row says which attempt succeeded (the one
/// holding `active_fence`) and numbers its event (`events`):
/// [`ReadAttempts`] and [`ReadEvents`] read them there. Successes
/// recorded before keep their `outcome`; their `outcome_seq` always
/// equalled the run's `events`.
///
/// The column stays, unread: workers of an earlier version, still running
/// while a fleet is upgraded, go on writing it, and their completions must
/// not fail on a column that is gone.
///
/// [`Complete`]: super::Statement::Complete
/// [`ReadAttempts`]: super::Statement::ReadAttempts
/// [`ReadEvents`]: super::Statement::ReadEvents
pub const SCHEMA_SUCCESS_ON_RUN: &str = r#"
COMMENT ON COLUMN attempts.outcome_seq IS
  'Unread since schema version 14 (a success is its run''s row); written by workers of earlier versions.';
"#;

/// Migration 15: retention without the `dead_letters` foreign key. Every
/// run retention deleted fired the key's check for a dead letter naming
/// it, 8.7–9.3 ms of a 17–22 ms pass of 1,000 (`EXPLAIN ANALYZE` of the
/// prepared `DeleteFinished`, 300,000 finished runs), though the same
/// statement deletes the dead letters. No statement writes a dead letter
/// without its run: each is written by the statement that buries the run,
/// as `attempts`' rows are by the claim (their key went in migration 2).
///
/// [`DeleteFinished`]: super::Statement::DeleteFinished
pub const SCHEMA_RETENTION: &str = r#"
ALTER TABLE dead_letters DROP CONSTRAINT IF EXISTS dead_letters_run_id_fkey;
"#;

/// Migration 16: exact rates, and the deployment's settings. A rate limit's GCRA state was kept in
/// milliseconds, its interval `floor(1000 / per_second)`: 501 calls a
/// second ran at 1,000. It is kept in nanoseconds now (`tat_ns`, by
/// `pelican_now_ns()`, the same clock as `pelican_now_ms()`), the interval
/// rounded up, so a rate is never exceeded and is slower than stated by
/// less than a millionth. [`TakeToken`] still writes `tat_ms`, the floor
/// of `tat_ns`, and reads the later of the two: workers of schema 15,
/// while a fleet is upgraded, respect the new state and are respected.
///
/// [`TakeToken`]: super::Statement::TakeToken
///
/// And the deployment's settings: its partition count, stored by the first
/// process to connect ([`AgreePartitions`]) and changed only by `pelican
/// partitions --set` ([`SetPartitions`]). A process started with another
/// count refuses to start: it would strand runs in partitions it does not
/// read, or publish to partitions no worker reads.
///
/// [`AgreePartitions`]: super::Statement::AgreePartitions
/// [`SetPartitions`]: super::Statement::SetPartitions
pub const SCHEMA_EXACT_RATES: &str = r#"
CREATE TABLE IF NOT EXISTS deployment (
    key text PRIMARY KEY,
    value bigint NOT NULL
);
ALTER TABLE provider_rates ADD COLUMN IF NOT EXISTS tat_ns bigint;
CREATE OR REPLACE FUNCTION pelican_now_ns() RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT coalesce(nullif(current_setting('pelican.now_ms', true), '')::bigint * 1000000,
                  (extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000)
$$;
"#;

/// Migration 17: due retries found in their order. [`PromoteRetries`]
/// takes the earliest due runs by `(retry_at, run_id)`, and the index on
/// `retry_at` alone gave that order only up to ties: a plan over it sorts
/// each group of equal `retry_at` whole before it can stop at the `LIMIT`.
/// Runs failed together come due together, so a pass sorted every run
/// due at that millisecond to promote a batch of them. The index now
/// holds the whole order; `run_id` never changes, so it costs the hot
/// path's HOT updates nothing.
///
/// [`PromoteRetries`]: super::Statement::PromoteRetries
pub const SCHEMA_RETRY_ORDER: &str = r#"
CREATE INDEX IF NOT EXISTS runs_retry_order ON runs (retry_at, run_id) WHERE retry_at IS NOT NULL;
DROP INDEX IF EXISTS runs_retry_due;
"#;

/// Migration 18: trace context. `trace_parent` is the W3C `traceparent`
/// a run was submitted under (NULL: none), which a claim answers so that
/// the attempt's spans join the caller's trace. Unindexed, and never
/// updated, so the hot path's updates stay HOT.
pub const SCHEMA_TRACE: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trace_parent text;
"#;

/// Migration 19: when each attempt was claimed and when its outcome was
/// written (Postgres's clock), for the dashboard's timeline. `claimed_at`
/// is the column's default, so a claim's statement is unchanged; a
/// success's end is the run's `finished_at`. Rows from before are NULL.
/// Added without a default first, so no existing row is rewritten.
pub const SCHEMA_ATTEMPT_TIMES: &str = r#"
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS claimed_at bigint;
ALTER TABLE attempts ALTER COLUMN claimed_at SET DEFAULT pelican_now_ms();
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS ended_at bigint;
"#;

/// Migration 20: delayed runs. A run submitted with a delay is inserted
/// `delayed`, with its due time in `retry_at` (found by the retry pass
/// through `runs_retry_order`, as due retries are) and kept in `due_at`,
/// which no later statement changes. The status check is replaced to allow
/// `delayed`: added `NOT VALID` (no scan under the exclusive lock) and then
/// validated, which lets writers go on. A unit test holds its list to
/// `RunStatus::ALL`.
pub const SCHEMA_DELAYED: &str = r#"
ALTER TABLE runs ADD COLUMN IF NOT EXISTS due_at bigint;
ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check CHECK (status IN
    ('delayed','queued','running','retry_wait','succeeded','failed','cancelled','dead')) NOT VALID;
ALTER TABLE runs VALIDATE CONSTRAINT runs_status_check;
"#;

/// Migration 21: cron schedules ([`crate::schedule`]). A schedule's
/// number, from `schedule_ids`, goes into its ticks' run ids, so the
/// sequence stops where [`crate::schedule::tick_run`] can encode it.
/// `next_tick` 0 means not planned yet; the scheduler's read walks
/// `schedules_next_tick`. A unit test holds the policies' checks to
/// [`Overlap::ALL`](crate::schedule::Overlap::ALL) and
/// [`Catchup::ALL`](crate::schedule::Catchup::ALL).
pub const SCHEMA_SCHEDULES: &str = r#"
CREATE SEQUENCE IF NOT EXISTS schedule_ids MAXVALUE 131071;
CREATE TABLE IF NOT EXISTS schedules (
    name      text PRIMARY KEY,
    id        bigint NOT NULL UNIQUE,
    kind      text NOT NULL,
    input     text NOT NULL,
    cron      text NOT NULL,
    tz        text NOT NULL,
    overlap   text NOT NULL CHECK (overlap IN ('skip','queue','cancel')),
    catchup   text NOT NULL CHECK (catchup IN ('skip','one')),
    next_tick bigint NOT NULL DEFAULT 0,
    last_tick bigint NOT NULL DEFAULT 0,
    last_run  bigint,
    fired     bigint NOT NULL DEFAULT 0,
    skipped   bigint NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS schedules_next_tick ON schedules (next_tick);
"#;

/// The reads of a snapshot of every table (`PgDb::snapshot`, for tests and
/// operators' checks: the invariants run over it), one per table, in one
/// transaction opened with [`snapshot::ISOLATION`]. Each reads the columns
/// the binding's row decoders read.
pub mod snapshot {
    /// One moment for every read, and no write.
    pub const ISOLATION: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";
    /// `runs`.
    pub const RUNS: &str = concat!("SELECT ", run_columns!(), " FROM runs");
    /// `attempts`.
    pub const ATTEMPTS: &str = "SELECT run_id, attempt, fence, worker, entry_id, dispatch, outcome, \
                                claimed_seq, claimed_at, ended_at FROM attempts";
    /// `dead_letters`.
    pub const DEAD_LETTERS: &str =
        "SELECT run_id, source_entry, class, message, attempts, requeued FROM dead_letters";
    /// `submit_keys`.
    pub const SUBMIT_KEYS: &str = "SELECT key, run_id, request, created_at FROM submit_keys";
    /// The deployment's partition count.
    pub const PARTITIONS: &str = "SELECT value FROM deployment WHERE key = 'partitions'";
    /// `workers`.
    pub const WORKERS: &str = "SELECT worker_id, host, pid, started_at FROM workers";
    /// `steps`.
    pub const STEPS: &str = "SELECT run_id, step, name, output, fence FROM steps";
    /// `run_events`.
    pub const RUN_EVENTS: &str =
        "SELECT run_id, seq, kind, attempt, fence, class, data FROM run_events";
    /// `provider_slots`.
    pub const PROVIDER_SLOTS: &str = "SELECT provider, slot, holder, until_ms FROM provider_slots";
    /// `provider_rates`, each rate's theoretical arrival time in
    /// nanoseconds (rows from before migration 16 hold it in ms).
    pub const PROVIDER_RATES: &str =
        "SELECT provider, GREATEST(tat_ns, tat_ms * 1000000) AS tat_ns FROM provider_rates";
    /// `effects`, the demo tool service's ledger.
    pub const EFFECTS: &str = "SELECT key, requests FROM effects";
    /// `schedules`, each with Postgres's clock, as the statements read them.
    pub const SCHEDULES: &str = concat!(
        "SELECT pelican_now_ms() AS now, ",
        schedule_columns!(),
        " FROM schedules"
    );
    /// The `schedule_ids` sequence's last number (0: none handed out).
    pub const SCHEDULE_IDS: &str =
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS value FROM schedule_ids";
}

/// The server process of a session (`PgSession::pid`), for tests that
/// kill one.
pub const BACKEND_PID: &str = "SELECT pg_backend_pid()";

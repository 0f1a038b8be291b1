//! End-to-end tests against live Redis and Postgres, on the correct build:
//! every scenario of `pelican_tests::scenarios` must pass.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use pelican_tests::scenarios as s;

macro_rules! live {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { s::$name(None); })*
    };
}

live! {
    through_the_api,
    pelican_dev_runs_everything_and_stops_clean,
    pelican_bench_reports_a_deployments_drain,
    runs_export_their_spans_to_an_otlp_receiver,
    kill_right_after_receive,
    kill_after_commit_before_ack,
    kill_right_after_ack,
    kill_right_after_the_side_effect,
    kill_between_a_steps_call_and_its_record,
    kill_right_after_a_step_is_recorded,
    premature_reclaim_of_a_live_long_job,
    late_worker_does_not_ack_a_reclaimed_entry,
    retryable_errors_back_off_then_dead_letter,
    unknown_errors_are_retried_up_to_the_cap,
    budgets_and_timeouts_bound_runs,
    delayed_runs_start_when_due,
    schedule_ticks_run_once,
    provider_limits_hold_across_two_workers,
    a_dead_workers_permit_frees_after_its_hold,
    submit_from_file_stores_every_line,
    bulk_submit_answers_each_item,
    terminal_error_is_not_retried,
    poison_values_fail_alone,
    keyed_retry_through_a_lock_wait,
    skewed_clock_takes_no_live_lease,
    contained_workers_get_unique_names,
    trimmed_pending_entry_is_recovered,
    redis_restart_with_aof,
    total_redis_data_loss,
    postgres_restart,
    sigterm_finishes_in_flight_jobs,
    sigterm_leaves_a_long_job_pending,
    malformed_stream_entries_are_quarantined,
    cancelled_before_delivery_never_runs,
    cancel_stops_a_running_job,
    unpublished_run_is_published_by_the_outbox,
    retention_deletes_finished_runs,
    migrate_upgrades_a_version_1_database,
    bad_api_requests_get_clear_errors,
    bad_flags_and_unreachable_servers_fail_clearly,
    retention_trims_acknowledged_entries,
    pipelined_acks_answer_each_xack,
    run_events_survive_a_kill_and_a_reconnect,
    a_late_attempts_progress_is_refused,
    the_client_library_against_the_api,
    the_runs_api_lists_pages_and_requeues,
    the_incident_routes_find_count_and_act_in_bulk,
    the_queue_route_reports_lag_and_pending,
    the_openapi_document_is_the_served_routes,
    the_api_conforms_to_its_openapi_document,
    worker_probes_follow_its_connections,
    the_deploy_kit_names_only_exported_metrics,
    redis_cluster_master_failover,
    partitions_spread_over_cluster_masters,
    retention_keeps_pace_with_finished_runs,
    a_redis_wipe_is_recovered_at_the_servers_pace,
    an_events_stream_ends_at_a_full_reads_terminal_event,
    sigterm_ends_an_apis_events_streams,
    requeue_gives_a_fresh_budget_and_unknown_count,
    logs_carry_ids_and_names_never_values,
    tokens_are_read_as_secret_stores_write_them,
    one_reader_feeds_every_events_stream,
    retention_keeps_a_keys_window,
    a_keyed_bulk_is_one_statement,
    a_partition_count_is_the_deployments,
    the_api_bounds_slow_heads_and_connections,
    idle_consumers_are_forgotten_unless_they_hold,
}

/// The bench's work counters read real servers: a Postgres started with
/// the bench's settings counts each statement's calls, and Redis each
/// command's, as `pelican-bench` reads them around a drain.
#[test]
fn the_bench_counts_each_servers_work() {
    use pelican_real::live::PgDb;
    use pelican_tests::bench::work::{self, Work};
    use pelican_tests::{Cluster, Database, Redis};
    use std::time::Duration;

    let cluster = Cluster::start_with(&work::PG_SETTINGS);
    let db = Database::create_on(&cluster.admin_url());
    let redis = Redis::start();
    let rt = pelican_tests::rt();
    let pg = rt
        .block_on(PgDb::connect(db.url(), 1, Duration::from_secs(10)))
        .expect("the test's Postgres answers");
    let before = work::tally(rt, &redis, &pg);
    let mut conn = redis.conn();
    for i in 0..7 {
        let _: String = redis::cmd("XADD")
            .arg("k")
            .arg("*")
            .arg("f")
            .arg(i)
            .query(&mut conn)
            .expect("XADD");
    }
    for i in 0..5_i32 {
        let _: (i32,) = rt
            .block_on(
                sqlx::query_as("SELECT $1::int + 1")
                    .bind(i)
                    .fetch_one(pg.pool()),
            )
            .expect("the statement runs");
    }
    let w = Work::between(&before, &work::tally(rt, &redis, &pg), 10);
    let calls = |lines: &[work::Line], name: &str| {
        lines
            .iter()
            .find(|l| l.name.starts_with(name))
            .map(|l| l.calls)
            .unwrap_or_else(|| panic!("{name} is counted: {w}"))
    };
    assert!((calls(&w.redis, "XADD") - 0.7).abs() < 1e-9, "{w}");
    assert!(
        (calls(&w.postgres, "SELECT $1::int + $2") - 0.5).abs() < 1e-9,
        "{w}"
    );
}

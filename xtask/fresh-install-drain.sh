#!/usr/bin/env bash
# How fast one worker drains RUNS no-op runs on a fresh install: a new
# database, the runs submitted in bulk, and the worker started at once,
# before any vacuum or analyze has given the planner statistics (the
# bench vacuums first). With `analyze` the tables are analyzed before the
# worker starts, for comparison; see docs/PERFORMANCE.md.
#
#   xtask/fresh-install-drain.sh target/release/pelican 1000000 [analyze]
#
# Needs psql and redis-cli, a Postgres that lets it create the database
# pelican_fresh (PG_URL, default postgres://postgres@127.0.0.1:5432) and a
# Redis (REDIS_URL, default redis://127.0.0.1:6379); it uses a stream
# prefix of its own.
set -euo pipefail
. "$(dirname "$0")/drain-common.sh"
usage="usage: $0 PELICAN_BINARY RUNS [analyze]"
bin=${1:?$usage}
runs=${2:?$usage}
analyze=${3:-}
pg=${PG_URL:-postgres://postgres@127.0.0.1:5432}
db=pelican_fresh
prefix=fresh$$
work=$(mktemp -d)
worker=
cleanup() {
  [ -n "$worker" ] && kill "$worker" 2>/dev/null
  rm -rf "$work"
  redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379}" del "$prefix:jobs" >/dev/null 2>&1 || true
}
trap cleanup EXIT
new_database "$bin"
awk -v n="$runs" 'BEGIN { for (i = 0; i < n; i++) print "{\"kind\":\"noop\",\"input\":{\"i\":" i "}}" }' > "$work/runs.jsonl"
"$bin" submit --from-file "$work/runs.jsonl" >/dev/null
case "$analyze" in
  analyze) psql -q "$DATABASE_URL" -c "analyze" ;;
  "") ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
stats=$(psql -tA "$DATABASE_URL" -c "select coalesce(max(greatest(last_analyze, last_autoanalyze))::text, 'never') from pg_stat_user_tables where relname = 'runs'")
start=$(date +%s%N)
"$bin" worker --id 1 --in-flight-max 4096 --batch-max 512 --log-level warn 2>"$work/worker.log" &
worker=$!
wait_drained "$worker" "$work/worker.log" 0.2
end=$(date +%s%N)
echo "$runs runs, runs analyzed before the drain: $stats; drained in $(( (end - start) / 1000000 )) ms, $(( runs * 1000000000 / (end - start) )) jobs/s"

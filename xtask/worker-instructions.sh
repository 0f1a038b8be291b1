#!/usr/bin/env bash
# Instructions a worker executes to drain N no-op runs, counted by
# valgrind (cachegrind, no cache simulation): repeatable where wall-clock
# drains are not. Run it for two sizes and take the difference per run to
# leave out start-up; see docs/PERFORMANCE.md.
#
#   xtask/worker-instructions.sh target/release/pelican 20000
#
# Needs valgrind, psql and redis-cli, a Postgres that lets it create the
# database pelican_instructions (PG_URL, default
# postgres://postgres@127.0.0.1:5432) and a Redis (REDIS_URL, default
# redis://127.0.0.1:6379); it uses a stream prefix of its own.
set -euo pipefail
bin=${1:?usage: $0 PELICAN_BINARY RUNS}
runs=${2:?usage: $0 PELICAN_BINARY RUNS}
pg=${PG_URL:-postgres://postgres@127.0.0.1:5432}
db=pelican_instructions
prefix=instructions$$
work=$(mktemp -d)
trap 'rm -rf "$work"; redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379}" del "$prefix:jobs" >/dev/null 2>&1 || true' EXIT
psql -q "$pg/postgres" -c "drop database if exists $db" -c "create database $db" >/dev/null
export DATABASE_URL=$pg/$db PELICAN_STREAM=$prefix
"$bin" migrate >/dev/null
awk -v n="$runs" 'BEGIN { for (i = 0; i < n; i++) print "{\"kind\":\"noop\"}" }' > "$work/runs.jsonl"
"$bin" submit --from-file "$work/runs.jsonl" >/dev/null
valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$work/out" \
  "$bin" worker --id 1 --in-flight-max 4096 --batch-max 512 --log-level warn 2>"$work/valgrind" &
worker=$!
until [ "$(psql -tA "$pg/$db" -c "select count(*) from runs where status <> 'succeeded'")" = 0 ]; do
  if ! kill -0 "$worker" 2>/dev/null; then
    echo "the worker exited before the runs were drained:" >&2
    tail -n 20 "$work/valgrind" >&2
    exit 1
  fi
  sleep 0.5
done
kill -TERM "$worker"
wait "$worker"
refs=$(grep -m1 'I *refs' "$work/valgrind" | tr -d ',' | awk '{print $NF}')
echo "$runs runs: $refs instructions"

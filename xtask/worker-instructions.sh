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
. "$(dirname "$0")/drain-common.sh"
bin=${1:?usage: $0 PELICAN_BINARY RUNS}
runs=${2:?usage: $0 PELICAN_BINARY RUNS}
pg=${PG_URL:-postgres://postgres@127.0.0.1:5432}
db=pelican_instructions
prefix=instructions$$
work=$(mktemp -d)
trap 'rm -rf "$work"; redis-cli -u "${REDIS_URL:-redis://127.0.0.1:6379}" del "$prefix:jobs" >/dev/null 2>&1 || true' EXIT
new_database "$bin"
awk -v n="$runs" 'BEGIN { for (i = 0; i < n; i++) print "{\"kind\":\"noop\"}" }' > "$work/runs.jsonl"
"$bin" submit --from-file "$work/runs.jsonl" >/dev/null
valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$work/out" \
  "$bin" worker --id 1 --in-flight-max 4096 --batch-max 512 --log-level warn 2>"$work/valgrind" &
worker=$!
wait_drained "$worker" "$work/valgrind" 0.5
kill -TERM "$worker"
wait "$worker"
refs=$(grep -m1 'I *refs' "$work/valgrind" | tr -d ',' | awk '{print $NF}')
echo "$runs runs: $refs instructions"

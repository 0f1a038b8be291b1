#!/usr/bin/env bash
# What a run costs each process, and the WAL it writes: RUNS no-op runs
# submitted with `pelican submit --from-file`, then drained by one worker,
# each phase's CPU (user and system, from /proc: the submitter or the
# worker, every Postgres process with its ended children, Redis) and WAL
# bytes divided by RUNS. See docs/SCALING.md.
#
#   xtask/run-costs.sh target/release/pelican 100000
#
# Needs psql and redis-cli, the machine's Postgres (PG_URL, default
# postgres://postgres@127.0.0.1:5432, its postmaster's pid in PG_PIDFILE,
# default /var/run/postgresql/15-main.pid) and Redis on 127.0.0.1:6379
# (REDIS_URL); it makes the database pelican_costs and a stream prefix of
# its own. The servers' other work in the meantime counts too: run it on
# a quiet machine.
set -euo pipefail
. "$(dirname "$0")/drain-common.sh"
bin=${1:?usage: $0 PELICAN_BINARY RUNS}
runs=${2:?usage: $0 PELICAN_BINARY RUNS}
pg=${PG_URL:-postgres://postgres@127.0.0.1:5432}
redis=${REDIS_URL:-redis://127.0.0.1:6379}
db=pelican_costs
prefix=costs$$
work=$(mktemp -d)
trap 'rm -rf "$work"; redis-cli -u "$redis" del "$prefix:jobs" >/dev/null 2>&1 || true' EXIT
tick=$(getconf CLK_TCK)
postmaster=$(head -1 "${PG_PIDFILE:-/var/run/postgresql/15-main.pid}")
redis_pid=$(redis-cli -u "$redis" info server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }')

# Clock ticks of CPU the pids took, with their ended children's.
ticks() {
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    # Fields after the command's closing parenthesis: utime is the 12th.
    set -- $(sed 's/.*) //' "/proc/$p/stat")
    t=$((t + ${12} + ${13} + ${14} + ${15}))
  done
  echo "$t"
}
postgres_ticks() { ticks "$postmaster" $(pgrep -P "$postmaster"); }
wal() { psql -tA "$pg/postgres" -c "select pg_current_wal_lsn()"; }
# Prints one phase's line from its start's and end's readings.
report() {
  local what=$1 own=$2 pg0=$3 pg1=$4 r0=$5 r1=$6 lsn0=$7 lsn1=$8 seconds=$9
  local bytes
  bytes=$(psql -tA "$pg/postgres" -c "select pg_wal_lsn_diff('$lsn1', '$lsn0')")
  awk -v w="$what" -v n="$runs" -v t="$tick" -v own="$own" -v pg="$((pg1 - pg0))" \
    -v r="$((r1 - r0))" -v b="$bytes" -v s="$seconds" 'BEGIN {
    printf "%s: %.0f runs/s; CPU µs a run: %s %.1f, Postgres %.1f, Redis %.1f; WAL %.0f bytes a run\n",
      w, n / s, (w == "submit" ? "submitter" : "worker"), own / t * 1e6 / n,
      pg / t * 1e6 / n, r / t * 1e6 / n, b / n }'
}

new_database "$bin"
awk -v n="$runs" 'BEGIN { for (i = 0; i < n; i++) print "{\"kind\":\"noop\"}" }' > "$work/runs.jsonl"

lsn0=$(wal); pg0=$(postgres_ticks); r0=$(ticks "$redis_pid"); t0=$(date +%s.%N)
"$bin" submit --from-file "$work/runs.jsonl" >/dev/null &
submitter=$!
# Its own ticks just before it is reaped.
while kill -0 "$submitter" 2>/dev/null; do own=$(ticks "$submitter"); sleep 0.01; done
wait "$submitter"
t1=$(date +%s.%N); pg1=$(postgres_ticks); r1=$(ticks "$redis_pid"); lsn1=$(wal)
report submit "${own:-0}" "$pg0" "$pg1" "$r0" "$r1" "$lsn0" "$lsn1" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"

psql -q "$DATABASE_URL" -c "vacuum analyze" -c checkpoint
lsn0=$(wal); pg0=$(postgres_ticks); r0=$(ticks "$redis_pid"); t0=$(date +%s.%N)
"$bin" worker --id 1 --in-flight-max 4096 --batch-max 512 --log-level warn 2>"$work/log" &
worker=$!
wait_drained "$worker" "$work/log" 0.05
t1=$(date +%s.%N); pg1=$(postgres_ticks); r1=$(ticks "$redis_pid"); lsn1=$(wal)
own=$(ticks "$worker")
kill -TERM "$worker"
wait "$worker"
report drain "$own" "$pg0" "$pg1" "$r0" "$r1" "$lsn0" "$lsn1" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"
psql -q "$pg/postgres" -c "drop database $db" >/dev/null

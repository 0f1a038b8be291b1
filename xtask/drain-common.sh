# Sourced by the drain scripts beside it (worker-instructions.sh,
# fresh-install-drain.sh): a new database for one drain, and the wait for
# it. Each script sets pg (the server's URL, no database), db and prefix.

# Drops and creates the database $db, points DATABASE_URL and
# PELICAN_STREAM at it and at the stream prefix $prefix, and migrates.
new_database() {
  local bin=$1
  psql -q "$pg/postgres" -c "set client_min_messages = warning" \
    -c "drop database if exists $db" -c "create database $db" >/dev/null
  export DATABASE_URL=$pg/$db PELICAN_STREAM=$prefix
  "$bin" migrate >/dev/null
}

# Waits until no run is unfinished (runs_live holds the unfinished runs,
# so the count stays cheap), polling every SECONDS, and fails, with the end
# of LOG, if the worker WORKER_PID exits first.
wait_drained() {
  local worker=$1 log=$2 seconds=$3
  until [ "$(psql -tA "$DATABASE_URL" -c "select count(*) from runs where finished_at is null")" = 0 ]; do
    if ! kill -0 "$worker" 2>/dev/null; then
      echo "the worker exited before the runs were drained:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    sleep "$seconds"
  done
}

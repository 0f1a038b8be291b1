#!/usr/bin/env bash
# What two stream commands cost Redis itself, on a throwaway redis-server
# (AOF everysec, as the bench runs it):
#
#  1. XAUTOCLAIM over a PEL of PENDING entries that are not idle long
#     enough to be claimed (as a reclaim pass finds a busy worker's
#     deliveries): Redis's time per call (INFO commandstats) at each COUNT,
#     which scans up to ten times COUNT entries of the PEL.
#  2. Acknowledging RUNS deliveries 512 at a time, as a pipeline of one-ID
#     XACKs (as `pelican worker` sends them) or as one XACK naming the 512:
#     Redis's CPU time per acknowledgement, from /proc (10 ms ticks).
#
# Usage: xtask/redis-stream-costs.sh [RUNS [PENDING]]
#        (defaults 100000 and 4096, the bench's in-flight depth)
set -euo pipefail
runs=${1:-100000}
pending=${2:-4096}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly yes \
    --appendfsync everysec --dir "$dir" --daemonize yes --pidfile "$dir/pid" >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
pid=$(cat "$dir/pid")
r() { redis-cli -p "$port" "$@"; }
cpu_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat"; }
# Lines of words to RESP, as a client sends them (not inline commands).
resp() {
    awk '{ printf "*%d\r\n", NF; for (i = 1; i <= NF; i++) printf "$%d\r\n%s\r\n", length($i), $i }'
}

# RUNS entries with IDs 1-1 .. RUNS-1, the first $1 read by one consumer.
fill() {
    r del x >/dev/null
    seq 1 "$runs" | awk '{ printf "XADD x %d-1 run %d kind noop input {}\n", $1, $1 }' \
        | resp | r --pipe >/dev/null
    r xgroup create x g 0 >/dev/null
    r xreadgroup group g c count "$1" streams x '>' >/dev/null
}

fill "$pending"
echo "XAUTOCLAIM over $pending pending entries, none idle enough (Redis's µs per call):"
for count in 1 10 100 512; do
    r config resetstat >/dev/null
    for _ in 1 2 3; do r xautoclaim x g c2 3600000 0-0 count "$count" >/dev/null; done
    per_call=$(r info commandstats | tr -d '\r' | sed -n 's/^cmdstat_xautoclaim:.*usec_per_call=\([0-9.]*\).*/\1/p')
    echo "  COUNT $count: $per_call"
done
r config resetstat >/dev/null
r xpending x g idle 3600000 - + 512 >/dev/null
per_call=$(r info commandstats | tr -d '\r' | sed -n 's/^cmdstat_xpending:.*usec_per_call=\([0-9.]*\).*/\1/p')
echo "  (XPENDING IDLE over the same PEL: $per_call)"

echo "Acknowledging $runs deliveries 512 at a time (Redis's CPU µs per acknowledgement):"
for form in one-id-xacks one-xack one-id-xacks one-xack; do
    fill "$runs"
    before=$(cpu_ticks)
    case $form in
        one-id-xacks) seq 1 "$runs" | awk '{ printf "XACK x g %d-1\n", $1 }' ;;
        one-xack) seq 1 "$runs" | awk '{ ids = ids " " $1 "-1" } NR % 512 == 0 { print "XACK x g" ids; ids = "" } END { if (ids != "") print "XACK x g" ids }' ;;
    esac | resp | r --pipe >/dev/null
    after=$(cpu_ticks)
    awk -v t=$((after - before)) -v n="$runs" -v f="$form" 'BEGIN { printf "  %-13s %.2f\n", f, t * 1e4 / n }'
done

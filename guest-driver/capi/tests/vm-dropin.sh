#!/bin/sh
# Proves the drop-in libibverbs.so.1 against real rxe. Run INSIDE the rxe VM (the workspace and
# target dir are shared at the same paths), after `cargo build --workspace` and after building
# tests/c/verbs_loopback.c and tests/c/async_events.c on the host (`vrdma-vm test dropin` does both):
#   vm-dropin.sh VRDMA_BACKEND LIBVRDMA_IBVERBS_SO VERBS_LOOPBACK_BINARY ASYNC_EVENTS_BINARY
# Runs ibv_devinfo and the C programs natively on rxe0, then the same unmodified binaries over
# vrdma (process transport) with LD_LIBRARY_PATH pointing at the drop-in, then DEVICE_FATAL
# over vrdma when its backend is killed. Exit status 0 = pass.
set -eu
backend_bin=$1
library=$2
program=$3
async_events=$4
dir=$(mktemp -d /tmp/vrdma-dropin.XXXXXX)
ln -s "$library" "$dir/libibverbs.so.1"
sock=$dir/backend.sock

"$backend_bin" --socket "$sock" --device rxe0 --allow-ud &
backend=$!
trap 'kill $backend 2>/dev/null; wait $backend 2>/dev/null; rm -rf "$dir"' EXIT
i=0
while [ ! -S "$sock" ]; do
	i=$((i + 1))
	[ $i -le 100 ] || { echo "backend socket never appeared" >&2; exit 1; }
	sleep 0.1
done

# Both runs must have exercised an SRQ, answered a UD request with ibv_create_ah_from_wc and
# resized a CQ with completions pending.
check_loopback() {
	for line in "SRQ: verified" "UD reply via ibv_create_ah_from_wc: 512 bytes verified" "CQ resize: 3 pending completions kept"; do
		grep -q "$line" "$1" || { echo "$2 verbs_loopback did not print \"$line\"" >&2; exit 1; }
	done
}

echo "=== native: verbs_loopback on rxe0"
status=0
"$program" >"$dir/native" 2>&1 || status=$?
cat "$dir/native"
[ $status -eq 0 ] || exit $status
check_loopback "$dir/native" native
# Not -v: that queries all 1024 GID entries of rxe0 twice, one control command each (minutes
# under TCG).
echo "=== vrdma: ibv_devinfo over the drop-in"
VRDMA_SOCKET=$sock LD_LIBRARY_PATH=$dir ibv_devinfo >"$dir/devinfo" 2>&1 || status=$?
cat "$dir/devinfo"
[ $status -eq 0 ] || exit $status
# A missing or unloadable drop-in would silently fall back to the system's libibverbs.
grep -q "hca_id:.*vrdma" "$dir/devinfo" || { echo "ibv_devinfo did not go through vrdma" >&2; exit 1; }
echo "=== vrdma: verbs_loopback over the drop-in"
VRDMA_SOCKET=$sock LD_LIBRARY_PATH=$dir "$program" >"$dir/loopback" 2>&1 || status=$?
cat "$dir/loopback"
[ $status -eq 0 ] || exit $status
grep -q "device: vrdma" "$dir/loopback" || { echo "the program did not go through vrdma" >&2; exit 1; }
check_loopback "$dir/loopback" vrdma
# The same checks in both runs: the program verifies each event and its object itself.
check_async() {
	for line in "SRQ limit reached: verified" "last WQE reached: verified" "async events: all passed"; do
		grep -q "$line" "$1" || { echo "$2 async_events did not print \"$line\"" >&2; exit 1; }
	done
}
echo "=== native: async_events on rxe0"
"$async_events" >"$dir/async-native" 2>&1 || status=$?
cat "$dir/async-native"
[ $status -eq 0 ] || exit $status
check_async "$dir/async-native" native
echo "=== vrdma: async_events over the drop-in"
VRDMA_SOCKET=$sock LD_LIBRARY_PATH=$dir "$async_events" >"$dir/async-vrdma" 2>&1 || status=$?
cat "$dir/async-vrdma"
[ $status -eq 0 ] || exit $status
grep -q "device: vrdma" "$dir/async-vrdma" || { echo "async_events did not go through vrdma" >&2; exit 1; }
check_async "$dir/async-vrdma" vrdma

echo "=== vrdma: DEVICE_FATAL when the backend is killed"
fatal_sock=$dir/fatal.sock
"$backend_bin" --socket "$fatal_sock" --device rxe0 &
fatal_backend=$!
i=0
while [ ! -S "$fatal_sock" ]; do
	i=$((i + 1))
	[ $i -le 100 ] || { echo "second backend socket never appeared" >&2; exit 1; }
	sleep 0.1
done
VRDMA_SOCKET=$fatal_sock LD_LIBRARY_PATH=$dir "$async_events" fatal >"$dir/fatal" 2>&1 &
fatal_program=$!
i=0
until grep -q "^ready" "$dir/fatal"; do
	i=$((i + 1))
	if [ $i -gt 600 ] || ! kill -0 $fatal_program 2>/dev/null; then
		cat "$dir/fatal"; echo "async_events fatal never got ready" >&2; exit 1
	fi
	sleep 0.1
done
kill -9 $fatal_backend
wait $fatal_backend 2>/dev/null || true
# A bound for a hang (the event never coming), not a measurement.
(sleep 120; kill $fatal_program 2>/dev/null) &
watchdog=$!
wait $fatal_program || status=$?
kill $watchdog 2>/dev/null || true
cat "$dir/fatal"
[ $status -eq 0 ] || exit $status
grep -q "device fatal: verified" "$dir/fatal" || { echo "no DEVICE_FATAL seen" >&2; exit 1; }

echo "=== without VRDMA_SOCKET the drop-in lists no device"
if LD_LIBRARY_PATH=$dir ibv_devinfo; then
	echo "ibv_devinfo succeeded without a transport" >&2
	exit 1
fi
echo "=== drop-in: all passed"

#!/bin/sh
# Proves the drop-in libibverbs.so.1 against real rxe. Run INSIDE the rxe VM (the workspace and
# target dir are shared at the same paths), after `cargo build --workspace` and after building
# tests/c/verbs_loopback.c on the host (`vrdma-vm test dropin` does both):
#   vm-dropin.sh VRDMA_BACKEND LIBVRDMA_IBVERBS_SO VERBS_LOOPBACK_BINARY
# Runs ibv_devinfo and the C program natively on rxe0, then the same unmodified binaries over
# vrdma (process transport) with LD_LIBRARY_PATH pointing at the drop-in. Exit status 0 = pass.
set -eu
backend_bin=$1
library=$2
program=$3
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

# Both runs must have exercised an SRQ and answered a UD request with ibv_create_ah_from_wc.
check_loopback() {
	for line in "SRQ: verified" "UD reply via ibv_create_ah_from_wc: 512 bytes verified"; do
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
echo "=== without VRDMA_SOCKET the drop-in lists no device"
if LD_LIBRARY_PATH=$dir ibv_devinfo; then
	echo "ibv_devinfo succeeded without a transport" >&2
	exit 1
fi
echo "=== drop-in: all passed"

#!/bin/sh
# Proves the drop-in libibverbs.so.1 against real rxe. Run INSIDE the rxe VM (the workspace and
# target dir are shared at the same paths), after `cargo build --workspace` and after building
# every tests/c/*.c on the host (`vrdma-vm test dropin` does both):
#   vm-dropin.sh VRDMA_BACKEND LIBVRDMA_IBVERBS_SO PROGRAM...
# Runs each C program natively on rxe0 and then, unmodified, over vrdma (process transport, the
# drop-in first on LD_LIBRARY_PATH); each must exit 0 and print the lines expected of it below
# in both runs. Then ibv_devinfo over the drop-in, IBV_EVENT_DEVICE_FATAL over vrdma when the
# backend is killed under a waiting program, and no device without a transport. Exit 0 = pass.
set -eu
backend_bin=$1
library=$2
shift 2
dir=$(mktemp -d /tmp/vrdma-dropin.XXXXXX)
ln -s "$library" "$dir/libibverbs.so.1"
sock=$dir/backend.sock

wait_socket() {
	i=0
	while [ ! -S "$1" ]; do
		i=$((i + 1))
		[ $i -le 100 ] || { echo "backend socket $1 never appeared" >&2; exit 1; }
		sleep 0.1
	done
}

"$backend_bin" --socket "$sock" --device rxe0 --allow-ud --allow-memory-windows &
backend=$!
trap 'kill $backend 2>/dev/null; wait $backend 2>/dev/null; rm -rf "$dir"' EXIT
wait_socket "$sock"

# What each program must print, natively and over vrdma (its own verification of the data,
# events and completions it checked; the last line is its verdict). A program without an entry
# fails the suite, so a new program in tests/c cannot go unchecked.
expected_lines() {
	case $1 in
	verbs_loopback) printf '%s\n' "SRQ: verified (resized twice with 4 receives posted)" "UD reply via ibv_create_ah_from_wc: 512 bytes verified" \
		"CQ resize: 3 pending completions kept" "PASS" ;;
	async_events) printf '%s\n' "SRQ limit reached: verified" "last WQE reached: verified" \
		"async events: all passed" ;;
	cq_ex_loopback) printf '%s\n' "cq_ex: all passed" ;;
	verbs_uc) printf '%s\n' "UC: PASS" ;;
	qp_ex_loopback) printf '%s\n' "atomics: compare and swap and fetch and add verified" \
		"atomic write: 8 bytes verified" "qp_ex_loopback: PASS" ;;
	mr_rereg) printf '%s\n' "reg_mr_iova: WRITE, READ and receive by iova verified" \
		"mr_rereg: all passed" ;;
	# Status 2: IBV_FORK_UNNEEDED (a kernel with copy-on-fork natively; private copies over vrdma).
	fork_child) printf '%s\n' "fork status: 2" "child's writes stayed in the child" \
		"WRITE into the parent's region after fork: 4096 bytes verified" "fork: all passed" ;;
	memory_windows) printf '%s\n' "type-1 window: RDMA WRITE: 4096 bytes verified" \
		"type-1 window: RDMA READ: 4096 bytes verified" \
		"type-1 window, read-only: RDMA WRITE: IBV_WC_REM_ACCESS_ERR" \
		"type-2 window: RDMA WRITE: 4096 bytes verified" \
		"type-2 window after LOCAL_INV: IBV_WC_REM_ACCESS_ERR" \
		"SEND_WITH_INV payload: 64 bytes verified" \
		"type-2 window after SEND_WITH_INV: IBV_WC_REM_ACCESS_ERR" \
		"type-1 window, still bound: RDMA READ: 4096 bytes verified" "memory windows: all passed" ;;
	mr_1gib) printf '%s\n' "1 GiB scattered: 262144 pages verified by RDMA READ" \
		"1 GiB contiguous: 262144 pages verified by RDMA READ" "mr_1gib: all passed" ;;
	*) echo "vm-dropin.sh: no expected lines for $1" >&2; exit 1 ;;
	esac
}

# What a program must print over vrdma besides: what vrdma does that native rxe does not
# (rdma-core's rxe provider has no ibv_rereg_mr, and fails a multi-entry SGE list in qp_ex).
expected_vrdma_lines() {
	case $1 in
	mr_rereg) printf '%s\n' "rereg access: verified" "rereg translation: verified" \
		"rereg PD: remote access through a QP of the old PD refused" ;;
	# rdma-core 56's rxe provider mis-posts inline data lists and multi-entry SGE lists of the
	# ibv_wr_* API natively (0 bytes arrive; the QP fails).
	qp_ex_loopback) printf '%s\n' "inline data list: verified" "SEND with a two-SGE list: verified" ;;
	# Each 4 MiB chunk re-backed with guest RAM on its own, odd ones first: 256 runs.
	mr_1gib) printf '%s\n' "scattered: region in 256 mappings" ;;
	esac
}

check_output() { # NAME FILE RUN
	expected_lines "$1" >"$dir/expected"
	[ "$3" = native ] || expected_vrdma_lines "$1" >>"$dir/expected"
	while IFS= read -r line; do
		grep -qF "$line" "$2" || { echo "$3 $1 did not print \"$line\"" >&2; exit 1; }
	done <"$dir/expected"
}

status=0
for program in "$@"; do
	name=$(basename "$program")
	echo "=== native: $name on rxe0"
	"$program" >"$dir/$name-native" 2>&1 || status=$?
	cat "$dir/$name-native"
	[ $status -eq 0 ] || exit $status
	check_output "$name" "$dir/$name-native" native
	echo "=== vrdma: $name over the drop-in"
	# Guest RAM for mr_1gib's two 1 GiB buffers (the memfd is sparse: unused RAM costs nothing).
	VRDMA_SOCKET=$sock VRDMA_RAM_SIZE=3G LD_LIBRARY_PATH=$dir "$program" >"$dir/$name-vrdma" 2>&1 || status=$?
	cat "$dir/$name-vrdma"
	[ $status -eq 0 ] || exit $status
	# A missing or unloadable drop-in would silently fall back to the system's libibverbs.
	grep -q "device: vrdma" "$dir/$name-vrdma" || { echo "$name did not go through vrdma" >&2; exit 1; }
	check_output "$name" "$dir/$name-vrdma" vrdma
	case $name in
	async_events) async_events=$program ;;
	verbs_loopback | cq_ex_loopback) staged_programs="${staged_programs:-} $program" ;;
	esac
done

# The CQ-heavy programs again through a backend that stages every QP and CQ (spec §9.7, §9.8:
# what a guest's objects past QEMU's memory slots get): completions copied by the backend,
# ibv_resize_cq with completions pending, extended CQs.
echo "=== vrdma: CQ programs through staging rings and staged CQs"
staged_sock=$dir/staged.sock
"$backend_bin" --socket "$staged_sock" --device rxe0 --allow-ud --staged-rings always --staged-cqs always &
staged_backend=$!
trap 'kill $backend $staged_backend 2>/dev/null || true; wait $backend 2>/dev/null || true; rm -rf "$dir"' EXIT
wait_socket "$staged_sock"
for program in ${staged_programs:?verbs_loopback and cq_ex_loopback must be among the programs}; do
	name=$(basename "$program")
	echo "=== vrdma staged: $name"
	VRDMA_SOCKET=$staged_sock LD_LIBRARY_PATH=$dir "$program" >"$dir/$name-staged" 2>&1 || status=$?
	cat "$dir/$name-staged"
	[ $status -eq 0 ] || exit $status
	grep -q "device: vrdma" "$dir/$name-staged" || { echo "$name did not go through vrdma" >&2; exit 1; }
	check_output "$name" "$dir/$name-staged" vrdma
done
kill $staged_backend
wait $staged_backend 2>/dev/null || true
trap 'kill $backend 2>/dev/null; wait $backend 2>/dev/null; rm -rf "$dir"' EXIT

# -v walks all of rxe0's GID entries twice (ibv_query_gid, ibv_query_gid_type): the drop-in's
# GID table cache answers that in a few commands. The GIDs it lists must be rxe0's own.
echo "=== vrdma: ibv_devinfo -v over the drop-in"
VRDMA_SOCKET=$sock LD_LIBRARY_PATH=$dir ibv_devinfo -v >"$dir/devinfo" 2>&1 || status=$?
cat "$dir/devinfo"
[ $status -eq 0 ] || exit $status
grep -q "hca_id:.*vrdma" "$dir/devinfo" || { echo "ibv_devinfo did not go through vrdma" >&2; exit 1; }
ibv_devinfo -v -d rxe0 >"$dir/devinfo-native" 2>&1 || status=$?
[ $status -eq 0 ] || { cat "$dir/devinfo-native"; exit $status; }
grep "GID\[" "$dir/devinfo-native" >"$dir/gids-native"
grep "GID\[" "$dir/devinfo" >"$dir/gids-vrdma"
[ -s "$dir/gids-native" ] || { echo "native ibv_devinfo -v lists no GID" >&2; exit 1; }
cmp "$dir/gids-native" "$dir/gids-vrdma" ||
	{ echo "the GID tables differ:" >&2; diff "$dir/gids-native" "$dir/gids-vrdma" >&2; exit 1; }

echo "=== vrdma: DEVICE_FATAL when the backend is killed"
fatal_sock=$dir/fatal.sock
"$backend_bin" --socket "$fatal_sock" --device rxe0 &
fatal_backend=$!
wait_socket "$fatal_sock"
# Our program, and rdma-core's unmodified ibv_asyncwatch (line-buffered through stdbuf, so its
# first line says when it is waiting).
VRDMA_SOCKET=$fatal_sock LD_LIBRARY_PATH=$dir "$async_events" fatal >"$dir/fatal" 2>&1 &
fatal_program=$!
VRDMA_SOCKET=$fatal_sock LD_LIBRARY_PATH=$dir stdbuf -oL ibv_asyncwatch -d vrdma0 >"$dir/asyncwatch" 2>&1 &
asyncwatch=$!
i=0
until grep -q "^ready" "$dir/fatal" && grep -q "^vrdma0: async event FD" "$dir/asyncwatch"; do
	i=$((i + 1))
	if [ $i -gt 1200 ] || ! kill -0 $fatal_program 2>/dev/null || ! kill -0 $asyncwatch 2>/dev/null; then
		cat "$dir/fatal" "$dir/asyncwatch"; echo "the DEVICE_FATAL waiters never got ready" >&2; exit 1
	fi
	sleep 0.1
done
kill -9 $fatal_backend
wait $fatal_backend 2>/dev/null || true
# A bound for a hang (the event never coming), not a measurement.
(sleep 120; kill $fatal_program $asyncwatch 2>/dev/null) &
watchdog=$!
wait $fatal_program || status=$?
# ibv_asyncwatch prints the event, then exits 1 when the next read fails (EIO: no more events).
asyncwatch_status=0
wait $asyncwatch || asyncwatch_status=$?
kill $watchdog 2>/dev/null || true
cat "$dir/fatal" "$dir/asyncwatch"
[ $status -eq 0 ] || exit $status
grep -q "device fatal: verified" "$dir/fatal" || { echo "no DEVICE_FATAL seen" >&2; exit 1; }
grep -q "event_type IBV_EVENT_DEVICE_FATAL (8), port 0" "$dir/asyncwatch" ||
	{ echo "ibv_asyncwatch saw no DEVICE_FATAL" >&2; exit 1; }
[ $asyncwatch_status -eq 1 ] || { echo "ibv_asyncwatch ended with $asyncwatch_status" >&2; exit 1; }

echo "=== without VRDMA_SOCKET the drop-in lists no device"
if LD_LIBRARY_PATH=$dir ibv_devinfo; then
	echo "ibv_devinfo succeeded without a transport" >&2
	exit 1
fi
echo "=== drop-in: all passed"

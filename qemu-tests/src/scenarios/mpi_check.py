"""MPI traffic between two ranks, every byte checked: `mpirun -np 2 python3 mpi_check.py ROUNDS SIZE...`.

Point-to-point: for each size, rank 0 sends a message to rank 1, which checks it and answers with
one of its own, which rank 0 checks; the sizes cross UCX's eager and rendezvous protocols. Then
collectives: a broadcast from rank 1 and an allreduce, checked on every rank. Each message is
distinct (seeded by size, round and sender) and not periodic, so a stale, shifted or truncated
buffer fails.

Each rank prints the libibverbs it loaded (from /proc/self/maps), so the caller can tell a rank
over vrdma's drop-in from a native one. Exits non-zero at the first mismatch.
"""

import random
import sys
from array import array

from mpi4py import MPI

ALLREDUCE_ELEMENTS = 1 << 17
BCAST_BYTES = 1 << 20


def message(size, round_, sender):
    return random.Random(f"{size}/{round_}/{sender}").randbytes(size)


def check(what, got, expected):
    if got != expected:
        at = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        print(f"MISMATCH {what}: first difference at byte {at}", flush=True)
        MPI.COMM_WORLD.Abort(1)


def libibverbs():
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    loaded = sorted(p for p in paths if "ibverbs" in p.rsplit("/", 1)[-1] and "/libibverbs/" not in p)
    return ",".join(loaded) or "none"


def main():
    rounds, sizes = int(sys.argv[1]), [int(size) for size in sys.argv[2:]]
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    if ranks != 2:
        print(f"needs 2 ranks, has {ranks}", flush=True)
        return 2
    peer = 1 - rank
    checked = 0
    for size in sizes:
        for round_ in range(rounds):
            buffer = bytearray(size)
            if rank == 0:
                comm.Send([message(size, round_, 0), MPI.BYTE], dest=peer, tag=size)
                comm.Recv([buffer, MPI.BYTE], source=peer, tag=size)
                check(f"reply of {size} bytes, round {round_}", buffer, message(size, round_, 1))
            else:
                comm.Recv([buffer, MPI.BYTE], source=peer, tag=size)
                check(f"message of {size} bytes, round {round_}", buffer, message(size, round_, 0))
                comm.Send([message(size, round_, 1), MPI.BYTE], dest=peer, tag=size)
            checked += size
    print(f"rank {rank}: point-to-point verified, {checked} bytes received", flush=True)

    broadcast = bytearray(message(BCAST_BYTES, 0, 1) if rank == 1 else BCAST_BYTES)
    comm.Bcast([broadcast, MPI.BYTE], root=1)
    check("broadcast", broadcast, message(BCAST_BYTES, 0, 1))

    contribution = array("q", (i * (rank + 1) for i in range(ALLREDUCE_ELEMENTS)))
    total = array("q", bytes(len(contribution) * contribution.itemsize))
    comm.Allreduce([contribution, MPI.INT64_T], [total, MPI.INT64_T], op=MPI.SUM)
    factor = ranks * (ranks + 1) // 2
    if any(value != i * factor for i, value in enumerate(total)):
        print("MISMATCH allreduce", flush=True)
        comm.Abort(1)
    print(f"rank {rank}: collectives verified (bcast, allreduce)", flush=True)

    comm.Barrier()
    print(f"rank {rank}: libibverbs {libibverbs()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

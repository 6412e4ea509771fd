//! `vrdma-pingpong`: a protocol that proves and measures an RDMA data path end to end.
//!
//! Two processes, a *server* and a *client*, connect an RC queue pair (and optionally a UD one)
//! over the same device, run a plan of operations and verify every byte they receive. The
//! protocol is implemented twice: here (over the vrdma verbs API, `src/bin/vrdma-pingpong.rs`)
//! and in `qemu-tests/native/pingpong.c` (over rdma-core's libibverbs), so that either
//! implementation can talk to the other. Any change here must be mirrored there.
//!
//! # Out-of-band connection
//! TCP, by default 127.0.0.1 port 18600. The server listens, the client connects (retrying
//! until the server listens). Lines are printable ASCII ending in `\n`, at most 1024 bytes,
//! each starting with `VRDMA-PP/1 `:
//!
//! ```text
//! VRDMA-PP/1 qpn=<hex> psn=<hex> gid=<32 hex digits> rkey=<hex> addr=<hex> len=<dec> plan=<plan>[ udqpn=<hex>]
//! VRDMA-PP/1 ready
//! VRDMA-PP/1 done
//! VRDMA-PP/1 ack
//! VRDMA-PP/1 error <text>
//! ```
//!
//! Hex numbers have no prefix, 1–16 digits, either case; `qpn`, `psn` and `udqpn` are 24-bit;
//! `gid` is port 1's GID index 0 in network byte order; `addr`/`rkey` name the *area* (below)
//! in the sender's memory region; `len` is the area's length in bytes (decimal, ≥ 1). Fields
//! appear exactly in this order, separated by one space; `udqpn` (the UD queue pair) is present
//! exactly when the plan contains `ud_send`. `plan` is `<ops>:<sizes>:<iters>:<mode>`:
//! comma-separated operation names, comma-separated decimal sizes (1..=1048576, distinct, at
//! most 32), the iteration count (1..=10^7), and the mode: `verify`, `bw<window>` (window
//! 1..=128) or `oneway`.
//!
//! Sequence: the client sends its hello; the server checks the plan (a size whose area does not
//! fit its buffer, an operation it cannot run …) and answers either `error <why>` and closes, or
//! its own hello echoing the plan unchanged. Both then bring their queue pairs to RTS, post
//! their receives, print `READY` on stderr, wait for a start file if one was given (a test
//! harness can act on the backend meanwhile) and send `ready`; each prints `RUNNING` and waits
//! for the peer's `ready` before its first work request. (A side given `--receives-after F`
//! posts its RC receives only once F exists, after `RUNNING`, and then prints `RECEIVES
//! POSTED`: the peer's first sends meet RNR NAKs until then. A local choice that lets a
//! harness exercise RNR retries.) After the last step each side waits for all its work
//! requests to complete, sends `done` and waits for the peer's `done` before tearing down. A
//! side that fails at any point sends `error <op> size <n> iteration <i>: <what>` and exits
//! non-zero; the other side watches the connection while it waits for completions and fails at
//! once too.
//!
//! # RDMA setup
//! RC queue pairs on port 1, GID index 0 (RoCE v2), path MTU 1024, random 24-bit PSNs, RNR and
//! transport retries 7 and min RNR timer 12 (0.64 ms) unless the command line says otherwise,
//! one outstanding RDMA read each way. Each side registers one buffer of
//! 2 × `len` bytes with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ: the first half is the *area*
//! (where peer writes land, peer reads come from, and every receive scatters to: all receives
//! name the whole area), the second half is the local *source* of outgoing payloads. `len` is
//! at least [`Plan::area_len`]: the largest size, or the largest UD size + 40 for the GRH.
//! The UD queue pair (Q_Key [`UD_QKEY`]) reaches the peer through an address handle built from
//! the peer's GID. A side sends payloads of up to its queue pairs' `max_inline` bytes (it asks
//! for [`MAX_INLINE`]) inline on the send and write paths; that choice is local.
//!
//! # Steps
//! Both sides run [`Plan::steps`]: for each operation in the plan's order, each size in the
//! plan's order (`ud_send` skips sizes above the MTU), `iters` iterations `i = 0, 1, …`. Every
//! payload of `size` bytes carries the [`pattern`] of (op, size, i, direction) and every
//! received payload is verified completely; "done", "ready" and "ack" below are 0-byte SENDs.
//! Immediate data is the iteration number (big-endian on the wire, as verbs carry it) and is
//! checked together with the completion's WITH_IMM flag; every receive's `byte_len` is checked.
//!
//! | op          | client → server                                 | server → client              |
//! |-------------|-------------------------------------------------|------------------------------|
//! | `send`      | SEND of size                                    | SEND of size                 |
//! | `send_imm`  | SEND_WITH_IMM of size, imm = i                  | the same                     |
//! | `write`     | RDMA WRITE of size to the peer's area, then done| the same                     |
//! | `write_imm` | RDMA WRITE_WITH_IMM, imm = i (byte_len = size)  | the same                     |
//! | `read`      | (waits for ready) RDMA READ of size, then ack   | fills its area, then ready   |
//! | `ud_send`   | UD SEND of size (received after a 40-byte GRH)  | the same                     |
//!
//! In `verify` mode each iteration is one round trip, timed on the client from its post to the
//! completion of the answer (for `read`: from the READ's post to its completion), and the
//! one-way latency is half of it. In `bw<W>` mode (only `send` and `write`) the client streams
//! `iters` messages with at most W outstanding: all but the last carry pattern (op, size, 0,
//! client→server); the last, which the client posts only after all others completed, carries
//! iteration `iters - 1`; `write` then sends done. The server counts the
//! receives (`send`) or waits for done (`write`), verifies that its area holds the last
//! message, and answers with ack. Throughput is timed from the first post to the last message's
//! completion.
//!
//! In `oneway` mode (every operation but `read`) only the client posts sends: for each
//! iteration it sends the payload as in `verify` mode, waits for its own completions and then
//! for the server's `ack` line on the TCP connection, which the server sends after verifying
//! the message. The server's data path thus needs no send (and, over vrdma, no backend).
//! Throughput is timed per iteration from the post to the `ack`; no latency is reported.
//!
//! # Waiting for completions
//! A local choice of each side, invisible to the peer: busy polling (the default), or
//! completion events (`--events`, see [`wait`]): a side with nothing to poll arms the CQ,
//! polls once more and sleeps until the CQ's completion event. Its CQs are armed before the
//! run while still empty, and each step ends by taking the events its completions made
//! certain, so the first step counts one at least. Each result row says which
//! (`completion`) and, for events, how many came (`completion_events`), how many ARM_CQ
//! commands were sent (`arms`) and how many events found no new completion
//! (`spurious_wakeups`).

pub mod endpoint;
pub mod error;
pub mod exchange;
pub mod oob;
pub mod options;
pub mod pattern;
pub mod plan;
pub mod report;
pub mod runner;
mod session;
pub mod stats;
pub mod wait;

pub use plan::{Mode, Op, Plan, Step};

/// Default TCP port of the out-of-band connection.
pub const DEFAULT_PORT: u16 = 18600;
/// Q_Key of the UD queue pairs.
pub const UD_QKEY: u32 = 0x1111_1111;
/// Inline payload bytes each side asks its queue pairs for.
pub const MAX_INLINE: u32 = 256;
/// Bound of every wait, unless the command line says otherwise.
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;

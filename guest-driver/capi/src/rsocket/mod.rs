//! rsockets: rdma-core's socket API over RDMA (`rsocket`, `rconnect`, `rsend`, `rpoll` …, in
//! `librdmacm.so.1` at `RDMACM_1.0`), over this library's own verbs and connection manager,
//! wire-compatible with rdma-core's stream rsockets (protocol version 1), so that a vrdma
//! rsocket talks to a native one either way and Debian's `librspreload.so` runs over it.
//!
//! Layers: [`wire`] (what goes on the wire), [`config`] (defaults and rdma-core's
//! configuration files), [`buffers`] (page buffers), [`endpoint`] (the verbs objects and the
//! work requests), [`stream`] (the protocol state of a connection), [`socket`] (one socket:
//! set-up, waits, send and receive), [`table`] (indexes to sockets), [`api`] and [`poll`]
//! (the C entry points).
//!
//! Not provided (each answers `ENOSYS`/`ENOTSUP`, see the capi README): datagram rsockets,
//! `riomap`/`riowrite`, keep-alive probes, and the `RDMA_ROUTE` option. A non-blocking
//! `rconnect` completes before it returns.

mod api;
mod buffers;
mod config;
mod endpoint;
mod poll;
mod socket;
mod stream;
mod table;
mod wire;

pub(crate) use api::*;
pub(crate) use poll::{rpoll, rselect};

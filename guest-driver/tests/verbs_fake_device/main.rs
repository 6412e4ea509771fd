//! The verbs API against the fake vrdma device of `vrdma_test_support::fake_transport`: a
//! `Transport` that answers every command from its own state, places rxe v1 queue buffers in a
//! shared-memory region it maps and unmaps per object, and plays a tiny loopback Soft-RoCE
//! "kernel" executing SEND, RDMA WRITE and RDMA READ between its QPs.
//!
//! [`control`]: opening, queries, object lifetimes, QP transitions, device failures;
//! [`data_path`]: work requests through the kernel, the doorbell, completion events;
//! [`resize_cq`]: CQ resizes with completions pending and pollers running.
//! [`uc`]: UC queue pairs end to end.
//! [`fork`]: what a `fork()` child inherits, and the parent's regions after it.
//! [`mr_rereg`]: re-registration of memory regions.
//! [`gid_cache`]: the context's GID table cache: its cost and its invalidation.
//! [`memory_windows`]: windows allocated, bound, used and invalidated through the kernel.
//! [`ud_staged`]: UD sends through staged send queues, checked as the device checks them.
//! [`staged_rings`]: receives to a staged receive queue ring the doorbell.
//! [`odp`]: on-demand-paging registrations and the capabilities the device describes.

mod batches;
mod control;
mod data_path;
mod fork;
mod gid_cache;
mod helpers;
mod memory_windows;
mod mr_extents;
mod mr_rereg;
mod odp;
mod resize_cq;
mod staged_rings;
mod uc;
mod ud_staged;

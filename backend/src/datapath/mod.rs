//! The data path of one guest, apart from control commands: the doorbell pump that kicks host
//! QPs ([`doorbell`]), the copy of staging rings it does first ([`staging`], retried by
//! [`staging_retry`]), and the copy of a staged CQ's completions ([`staged_cq`]), which the
//! host event pump (`guest_device::host_events`) calls. All run on the connection's fast worker
//! and never allocate per work request.

pub mod doorbell;
pub mod staged_cq;
pub mod staging;
pub mod staging_retry;

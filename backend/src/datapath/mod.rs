//! The data path of one guest, apart from control commands: the doorbell pump that kicks host
//! QPs ([`doorbell`]), and [`staging`]: the copy of staging rings the doorbell pump does
//! first, and the copy of a staged CQ's completions, which the host event pump
//! (`guest_device::host_events`) calls. All run on the connection's fast worker
//! and never allocate per work request.

pub mod doorbell;
pub mod staging;

//! The data path of one guest, apart from control commands: the doorbell pump that kicks host
//! QPs ([`doorbell`]), the copy of staging rings it does first ([`staging`]), and
//! the event pumps that turn host events into guest events ([`events`], and [`cm_events`] for
//! the connection manager's), which also copy the completions of staged CQs ([`staged_cq`]). All run on the connection's fast worker and never allocate per work request.

pub mod cm_events;
pub mod doorbell;
pub mod events;
pub mod staged_cq;
pub mod staging;
pub mod staging_retry;

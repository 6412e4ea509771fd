//! The data path of one guest, apart from control commands: the doorbell pump that kicks host
//! QPs ([`doorbell`]), the copy of staged UD send queues it does first ([`ud_staging`]), and
//! the event pump that turns host events into guest events ([`events`]).
//! Both run on the connection's fast worker and never allocate per work request.

pub mod doorbell;
pub mod events;
pub mod ud_staging;

//! Staging (spec §9.6–§9.8): queues the guest writes in the device's own memory, which the
//! device copies into the host's. One owner per piece: [`file`] (the guest's staging file and
//! the device's mappings of host queues), [`pump`] (staged WQEs into host queues, on the
//! guest's doorbells), [`wqe_check`] (what a staged UD WQE may do), [`cq_copy`] (host
//! completions into a staged CQ's ring), [`retry`] (when a ring waiting for room is pumped
//! again), [`lingering_ahs`] (destroyed AHs kept on the host while WQEs may name them). Placing a staging ring is a command's work (`control::staged_rings`).

pub mod cq_copy;
pub mod file;
mod lingering_ahs;
mod pump;
pub mod retry;
mod wqe_check;

pub use pump::{StagedKind, StagedRing, StagedRingInit, Staging};
pub use wqe_check::{
    check, neutralise, IsLocal, PassDestinations, Reach, Refusal, StagedAh, StagedAhs,
    NEUTRALISED_AH_NUM,
};

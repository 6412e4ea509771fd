//! Fuzzing the backend beyond decoding: whole command sequences against guest devices on the
//! fake host device ([`handlers`]), message streams through the vhost-user frontend filter
//! ([`filter`]) and through what vrdma-keeper keeps of them ([`keeper`]). Each entry point takes arbitrary bytes, never fails to decode them, and panics
//! only when the backend broke an invariant; the libFuzzer targets in `backend/fuzz/` call them,
//! and their tests run them on a fixed-seed set of inputs ([`bytes::fixed_seed_inputs`]) on
//! every `cargo test`.

pub mod bytes;
pub mod cm_invariants;
pub mod cm_requests;
pub mod filter;
pub mod guest_slot;
pub mod handlers;
pub mod invariants;
pub mod keeper;
pub mod requests;
pub mod staged_sends;
pub mod tenancy;

//! Whole control-command sequences, doorbells, host events, memory changes, resets and
//! disconnects against two guests on the fake host device; every step must keep the backend's
//! invariants (`vrdma_test_support::fuzz::handlers`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_test_support::fuzz::handlers::run_handler_sequence;

fuzz_target!(|data: &[u8]| run_handler_sequence(data));

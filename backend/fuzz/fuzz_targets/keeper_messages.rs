//! Front-end requests, daemon answers and back-end channel traffic through what vrdma-keeper
//! keeps of them (`vrdma_test_support::fuzz::keeper`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_test_support::fuzz::keeper::run_keeper_sequence;

fuzz_target!(|data: &[u8]| run_keeper_sequence(data));

//! vhost-user message streams through the frontend filter, compared with a model of its
//! rules (`vrdma_test_support::fuzz::filter`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_test_support::fuzz::filter::run_filter_sequence;

fuzz_target!(|data: &[u8]| run_filter_sequence(data));

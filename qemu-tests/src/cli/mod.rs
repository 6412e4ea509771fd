//! The bodies of `vrdma-vm`'s subcommands; the binary (`src/bin/vrdma-vm.rs`) holds only the
//! command line and the dispatch to these.
//!
//! A test suite has two halves: the host half (`vrdma-vm test SUITE`) boots the VM and runs
//! the guest half (`vrdma-vm guest SUITE`, [`guest_suite`]) in it, then prints what the guest
//! half reported. One module per suite holds both halves.

pub mod agent;
pub mod backend_device;
pub mod bench;
pub mod dropin;
pub mod guest_suite;
pub mod host;
pub mod native_perftest;
pub mod perftest_over_vrdma;
pub mod prepare;
pub mod process_pingpong;
pub mod qtest_pingpong;
pub mod rdmacm_utils;
pub mod real_guest;
pub mod run;
pub mod tenants;
pub mod two_hosts;
pub mod verbs_utils;
pub mod vm_args;

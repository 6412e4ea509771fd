//! Test harness for vrdma: a Soft-RoCE (rdma_rxe) VM under QEMU.
//!
//! This machine's kernel (and many CI kernels) has no RDMA subsystem, so every RDMA test runs
//! inside a small Debian VM that loads `rdma_rxe`. The VM's root file system is built once into a
//! cache outside the repository ([`rootfs`]), booted from a tiny initramfs of our own
//! ([`initramfs`]) with the root, the workspace and the target directory shared over 9p at the
//! same paths as on the host ([`vm`]), so a test binary built here runs unchanged inside.

#![deny(unsafe_code)]

pub mod accel;
pub mod bench;
pub mod boot_timeline;
pub mod cache;
pub mod cli;
pub mod error;
pub mod guest_package;
pub mod host;
pub mod initramfs;
pub mod inside;
pub mod kernel_image;
pub mod native;
pub mod perftest;
pub mod qtest;
pub mod relay;
pub mod rootfs;
pub mod scenarios;
pub mod vm;
pub mod vm_link;
pub mod vm_pair;
pub mod vm_snapshot;
pub mod workspace;

pub use error::{Error, Result};

//! The fork family of libibverbs: `ibv_fork_init`, `ibv_is_fork_initialized`,
//! `ibv_dontfork_range`, `ibv_dofork_range`, with rdma-core's semantics (`memory.c`), and what a
//! `fork()` child gets of re-backed memory ([`atfork`]).
//!
//! rdma-core asks the kernel whether it copies pinned pages to a child at fork time
//! ("copy-on-fork", Linux 5.13+). If so, `ibv_is_fork_initialized` answers
//! `IBV_FORK_UNNEEDED` and `ibv_fork_init` does nothing (unless `RDMAV_USE_MADVISE` asks for
//! madvise mode anyway). This library answers for its own transports:
//!
//! - process transport (`VRDMA_SOCKET`): copy-on-fork holds, by [`atfork`]: the child gets
//!   private copies of re-backed memory and the parent keeps its pages;
//! - PCI transport: registered memory is ordinary private memory the device reaches by its
//!   physical address, and after `fork()` a write by the parent may move the parent to a new
//!   copy of a page, away from the device: as on a kernel without copy-on-fork, `ibv_fork_init`
//!   ([`madvise`] mode) is what prevents it.

mod atfork;
mod madvise;
mod ranges;

use std::ffi::{c_int, c_void};
use std::sync::Once;

pub(crate) use atfork::{hold as hold_fork, register_ram};
use madvise::{ForkEnv, FORK_SUPPORT};

use crate::config::{self, TransportChoice};
use crate::ffi::{guard, set_errno};

/// `enum ibv_fork_status` of `<infiniband/verbs.h>`.
const IBV_FORK_DISABLED: u32 = 0;
const IBV_FORK_ENABLED: u32 = 1;
const IBV_FORK_UNNEEDED: u32 = 2;

/// rdma-core's `check_env`: set, and not "0".
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| value != "0")
}

fn fork_env() -> ForkEnv {
    ForkEnv {
        // rdma-core tests this one with a bare getenv: any value counts.
        hugepages_safe: std::env::var_os("RDMAV_HUGEPAGES_SAFE").is_some(),
        use_madvise: env_flag("RDMAV_USE_MADVISE"),
    }
}

/// Whether `fork()` children get copies of registered memory without madvise mode: true for
/// the process and agent transports, whose registered memory is re-backed guest RAM (see the
/// module documentation).
fn copy_on_fork() -> bool {
    matches!(
        config::from_env(),
        Ok(TransportChoice::Process { .. } | TransportChoice::Agent { .. })
    )
}

/// `RDMAV_FORK_SAFE` / `IBV_FORK_SAFE`: `ibv_fork_init` at the first `ibv_get_device_list`,
/// as rdma-core's library initialisation does.
pub(crate) fn init_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if env_flag("RDMAV_FORK_SAFE") || env_flag("IBV_FORK_SAFE") {
            let rc = FORK_SUPPORT.init(fork_env(), copy_on_fork());
            if rc != 0 {
                eprintln!("vrdma: Warning: fork()-safety requested but init failed");
            }
        }
    });
}

/// `ibv_dontfork_range` for the library's own registration: madvise mode's counting and advice.
pub(crate) fn dont_fork(base: usize, size: usize) -> std::io::Result<()> {
    FORK_SUPPORT.dont_fork(base, size)
}

/// `ibv_dofork_range` for the library's own deregistration.
pub(crate) fn do_fork(base: usize, size: usize) {
    FORK_SUPPORT.do_fork(base, size)
}

/// `ibv_fork_init` (IBVERBS_1.1): 0, `EINVAL` once memory was registered without madvise mode
/// (too late to make the parent's pages safe), `ENOSYS` without `MADV_DONTFORK`.
///
/// # Safety
/// None: takes no pointers.
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    guard("ibv_fork_init", libc::EIO, || {
        FORK_SUPPORT.init(fork_env(), copy_on_fork())
    })
}

/// `ibv_is_fork_initialized` (IBVERBS_1.13): `IBV_FORK_UNNEEDED` with the process transport,
/// else `IBV_FORK_ENABLED` after a successful `ibv_fork_init`, else `IBV_FORK_DISABLED`.
///
/// # Safety
/// None: takes no pointers.
pub unsafe extern "C" fn ibv_is_fork_initialized() -> u32 {
    guard("ibv_is_fork_initialized", IBV_FORK_DISABLED, || {
        fork_status(copy_on_fork(), FORK_SUPPORT.is_enabled())
    })
}

fn fork_status(copy_on_fork: bool, enabled: bool) -> u32 {
    match (copy_on_fork, enabled) {
        (true, _) => IBV_FORK_UNNEEDED,
        (false, true) => IBV_FORK_ENABLED,
        (false, false) => IBV_FORK_DISABLED,
    }
}

/// `ibv_dontfork_range` (IBVERBS_1.1): 0, or -1 with errno (the range is not mapped).
///
/// # Safety
/// None: the range is only advised, never dereferenced.
pub unsafe extern "C" fn ibv_dontfork_range(base: *mut c_void, size: usize) -> c_int {
    guard("ibv_dontfork_range", -1, || {
        match FORK_SUPPORT.dont_fork(base as usize, size) {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
                -1
            }
        }
    })
}

/// `ibv_dofork_range` (IBVERBS_1.1): 0.
///
/// # Safety
/// None: the range is only advised, never dereferenced.
pub unsafe extern "C" fn ibv_dofork_range(base: *mut c_void, size: usize) -> c_int {
    guard("ibv_dofork_range", -1, || {
        FORK_SUPPORT.do_fork(base as usize, size);
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_says_unneeded_where_children_get_copies() {
        assert_eq!(fork_status(true, false), IBV_FORK_UNNEEDED);
        assert_eq!(fork_status(true, true), IBV_FORK_UNNEEDED);
        assert_eq!(fork_status(false, true), IBV_FORK_ENABLED);
        assert_eq!(fork_status(false, false), IBV_FORK_DISABLED);
    }
}

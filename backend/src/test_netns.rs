// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Tests that change network interfaces, each in a network namespace of its own.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Runs `test` on a thread of its own in a fresh network namespace (the thread's only:
/// the test process's other threads keep theirs), with its loopback up. `None` when this
/// machine does not allow it (no CAP_SYS_ADMIN / CAP_NET_ADMIN): the caller skips.
pub(crate) fn in_private_netns<T: Send + 'static>(
    test: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    std::thread::spawn(move || {
        // SAFETY: unshare takes no pointers; it changes only this thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "skipped: cannot enter a new network namespace: {}",
                io::Error::last_os_error()
            );
            return None;
        }
        set_loopback_up().expect("loopback up");
        Some(test())
    })
    .join()
    .expect("test thread")
}

fn set_loopback_up() -> io::Result<()> {
    // SAFETY: socket() takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket() just returned this fd.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `request` is a valid ifreq for the whole call; SIOCGIFFLAGS fills ifru_flags.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member SIOCGIFFLAGS wrote.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `request`.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

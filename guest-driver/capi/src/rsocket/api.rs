//! The rsocket entry points of `librdmacm.so.1` (rdma-core's `rsocket.h`): each finds its
//! socket by index and answers as rdma-core's does, -1 and errno on failure.

use std::ffi::{c_int, c_long, c_void};

use super::socket::{RSocket, State};
use super::table;
use super::wire::{scale_to_value, value_to_scale};
use crate::ffi::{guard, set_errno};
use crate::rdmacm::rdma_set_option;
use crate::sys::*;

/// `SOL_RDMA` and its options (rdma-core's `rsocket.h`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;

fn fail<T: From<i8>>(errno: c_int) -> T {
    set_errno(errno);
    T::from(-1)
}

fn done(result: Result<(), c_int>) -> c_int {
    match result {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

fn sized(result: Result<usize, c_int>) -> isize {
    match result {
        Ok(n) => n as isize,
        Err(e) => fail(e),
    }
}

fn socket_of(index: c_int) -> Result<std::sync::Arc<RSocket>, c_int> {
    table::get(index).ok_or(libc::EBADF)
}

/// `rsocket`: stream sockets of `AF_INET`/`AF_INET6`; datagram rsockets are `ENOTSUP`.
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    guard("rsocket", -1, || {
        let base = kind & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        let stream = base == libc::SOCK_STREAM
            && (protocol == 0 || protocol == libc::IPPROTO_TCP)
            && (domain == libc::AF_INET || domain == libc::AF_INET6);
        if !stream {
            return fail(libc::ENOTSUP);
        }
        match RSocket::new() {
            Ok(socket) => {
                {
                    let mut inner = socket.inner.lock();
                    if kind & libc::SOCK_NONBLOCK != 0 {
                        inner.opts.fs_flags |= libc::O_NONBLOCK;
                    }
                    if kind & libc::SOCK_CLOEXEC != 0 {
                        inner.opts.fd_flags |= libc::FD_CLOEXEC;
                    }
                }
                table::insert(socket)
            }
            Err(e) => fail(e),
        }
    })
}

/// `rbind`.
///
/// # Safety
/// `addr` is readable for `addrlen` bytes.
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, _addrlen: socklen_t) -> c_int {
    guard("rbind", -1, || {
        done(socket_of(socket).and_then(|s| s.bind(addr.cast_mut())))
    })
}

/// `rlisten`.
pub extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    guard("rlisten", -1, || {
        done(socket_of(socket).and_then(|s| s.listen(backlog)))
    })
}

/// `raccept`: the new socket's index.
///
/// # Safety
/// `addr` is NULL or writable for `*addrlen` bytes; `addrlen` NULL or valid.
pub unsafe extern "C" fn raccept(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    guard("raccept", -1, || {
        let accepted = match socket_of(socket).and_then(|s| s.accept()) {
            Ok(accepted) => accepted,
            Err(e) => return fail(e),
        };
        let index = table::insert(accepted);
        if !addr.is_null() && !addrlen.is_null() {
            // SAFETY: caller contract.
            unsafe { rgetpeername(index, addr, addrlen) };
        }
        index
    })
}

/// `rconnect`.
///
/// # Safety
/// `addr` is readable for `addrlen` bytes.
pub unsafe extern "C" fn rconnect(
    socket: c_int,
    addr: *const sockaddr,
    _addrlen: socklen_t,
) -> c_int {
    guard("rconnect", -1, || {
        done(socket_of(socket).and_then(|s| s.connect(addr.cast_mut())))
    })
}

/// `rshutdown`.
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    guard("rshutdown", -1, || {
        done(socket_of(socket).and_then(|s| s.shutdown(how)))
    })
}

/// `rclose`: shuts the connection down and frees the socket.
pub extern "C" fn rclose(socket: c_int) -> c_int {
    guard("rclose", -1, || match table::remove(socket) {
        Some(s) => {
            s.close();
            0
        }
        None => fail(libc::EBADF),
    })
}

/// A caller's buffer as a slice (empty for a NULL pointer or no bytes).
///
/// # Safety
/// `buf` is NULL or readable for `len` bytes, unaliased by writes meanwhile.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

/// # Safety
/// `buf` is NULL or writable for `len` bytes.
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if buf.is_null() || len == 0 {
        return &mut [];
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

/// `rrecv`.
///
/// # Safety
/// `buf` is writable for `len` bytes.
pub unsafe extern "C" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guard("rrecv", -1, || {
        // SAFETY: caller contract.
        let buf = unsafe { bytes_mut(buf, len) };
        sized(socket_of(socket).and_then(|s| s.recv(buf, flags)))
    })
}

/// `rrecvfrom`: as `rrecv`, with the peer's address.
///
/// # Safety
/// As `rrecv`; `addr`/`addrlen` as for `rgetpeername` or NULL.
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> isize {
    // SAFETY: caller contract.
    let n = unsafe { rrecv(socket, buf, len, flags) };
    if n > 0 && !addr.is_null() && !addrlen.is_null() {
        // SAFETY: caller contract.
        unsafe { rgetpeername(socket, addr, addrlen) };
    }
    n
}

/// Runs `step` on each of `iov` in turn (with whether bytes already moved) until one is not
/// moved whole: the bytes moved, or -1 and errno when the first step failed.
///
/// # Safety
/// `iov` names `count` buffers valid for what `step` does with them.
unsafe fn vectored(
    socket: c_int,
    iov: *const libc::iovec,
    count: c_int,
    mut step: impl FnMut(&RSocket, libc::iovec, bool) -> Result<usize, c_int>,
) -> isize {
    if count < 0 || (count > 0 && iov.is_null()) {
        return fail(libc::EINVAL);
    }
    let s = match socket_of(socket) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let mut total = 0usize;
    for i in 0..count as usize {
        // SAFETY: caller contract.
        let v = unsafe { *iov.add(i) };
        match step(&s, v, total > 0) {
            Ok(n) => {
                total += n;
                if n < v.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return fail(e),
            Err(_) => break,
        }
    }
    total as isize
}

/// Receives into each of `iov` in turn until one is not filled (later ones without waiting).
///
/// # Safety
/// `iov` names `count` writable buffers.
unsafe fn recv_vectored(
    socket: c_int,
    iov: *const libc::iovec,
    count: c_int,
    flags: c_int,
) -> isize {
    // SAFETY: caller contract.
    unsafe {
        vectored(socket, iov, count, |s, v, more| {
            let flags = if more {
                flags | libc::MSG_DONTWAIT
            } else {
                flags
            };
            s.recv(bytes_mut(v.iov_base, v.iov_len), flags)
        })
    }
}

/// Sends each of `iov` in turn until one is not sent whole.
///
/// # Safety
/// `iov` names `count` readable buffers.
unsafe fn send_vectored(
    socket: c_int,
    iov: *const libc::iovec,
    count: c_int,
    flags: c_int,
) -> isize {
    // SAFETY: caller contract.
    unsafe {
        vectored(socket, iov, count, |s, v, _| {
            s.send(
                bytes(v.iov_base, v.iov_len),
                flags & libc::MSG_DONTWAIT != 0,
            )
        })
    }
}

/// The scatter list of `msg`; control messages are `ENOTSUP`.
///
/// # Safety
/// `msg` is NULL or a valid `msghdr`.
unsafe fn message_iov(msg: *const libc::msghdr) -> Result<(*const libc::iovec, c_int), c_int> {
    // SAFETY: caller contract.
    let m = unsafe { msg.as_ref() }.ok_or(libc::EINVAL)?;
    if !m.msg_control.is_null() && m.msg_controllen > 0 {
        return Err(libc::ENOTSUP);
    }
    Ok((m.msg_iov, m.msg_iovlen as c_int))
}

/// `rrecvmsg`: control messages are `ENOTSUP`.
///
/// # Safety
/// `msg` is a valid `msghdr` whose buffers are writable.
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    guard("rrecvmsg", -1, || {
        // SAFETY: caller contract.
        match unsafe { message_iov(msg) } {
            // SAFETY: caller contract.
            Ok((iov, count)) => unsafe { recv_vectored(socket, iov, count, flags) },
            Err(e) => fail(e),
        }
    })
}

/// `rsend`.
///
/// # Safety
/// `buf` is readable for `len` bytes.
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard("rsend", -1, || {
        // SAFETY: caller contract.
        let buf = unsafe { bytes(buf, len) };
        sized(socket_of(socket).and_then(|s| s.send(buf, flags & libc::MSG_DONTWAIT != 0)))
    })
}

/// `rsendto`: a connected stream takes no address (`EISCONN` when one is given).
///
/// # Safety
/// As `rsend`.
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> isize {
    if !addr.is_null() || addrlen != 0 {
        return fail(libc::EISCONN);
    }
    // SAFETY: caller contract.
    unsafe { rsend(socket, buf, len, flags) }
}

/// `rsendmsg`: control messages are `ENOTSUP`.
///
/// # Safety
/// `msg` is a valid `msghdr` whose buffers are readable.
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    guard("rsendmsg", -1, || {
        // SAFETY: caller contract.
        match unsafe { message_iov(msg) } {
            // SAFETY: caller contract.
            Ok((iov, count)) => unsafe { send_vectored(socket, iov, count, flags) },
            Err(e) => fail(e),
        }
    })
}

/// `rread`.
///
/// # Safety
/// As `rrecv`.
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: caller contract.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rreadv`.
///
/// # Safety
/// `iov` names `iovcnt` writable buffers.
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
    // SAFETY: caller contract.
    guard("rreadv", -1, || unsafe {
        recv_vectored(socket, iov, iovcnt, 0)
    })
}

/// `rwrite`.
///
/// # Safety
/// As `rsend`.
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
    // SAFETY: caller contract.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rwritev`.
///
/// # Safety
/// `iov` names `iovcnt` readable buffers.
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
    // SAFETY: caller contract.
    guard("rwritev", -1, || unsafe {
        send_vectored(socket, iov, iovcnt, 0)
    })
}

/// Copies a socket address out as `getsockname(2)` does (truncating to `*len`).
///
/// # Safety
/// `len` valid; `addr` writable for `*len` bytes, or NULL.
unsafe fn copy_addr(src: &sockaddr_storage, addr: *mut sockaddr, len: *mut socklen_t) {
    let size = match c_int::from(src.ss_family) {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => std::mem::size_of::<sockaddr_storage>(),
    };
    // SAFETY: caller contract.
    unsafe {
        let room = (*len as usize).min(size);
        if !addr.is_null() && room > 0 {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(src).cast::<u8>(),
                addr.cast::<u8>(),
                room,
            );
        }
        *len = size as socklen_t;
    }
}

fn name(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> c_int {
    // A NULL address with room 0 asks only for the length (librspreload does, to tell IPv4
    // from IPv6).
    // SAFETY: `len` is NULL or the caller's valid length.
    if len.is_null() || (addr.is_null() && unsafe { *len } != 0) {
        return fail(libc::EFAULT);
    }
    let s = match socket_of(socket) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let inner = s.inner.lock();
    // SAFETY: the socket's live id; its route addresses are plain storage.
    let storage = unsafe {
        let a = &(*inner.id).route.addr;
        if peer {
            a.__bindgen_anon_2.dst_storage
        } else {
            a.__bindgen_anon_1.src_storage
        }
    };
    if peer && !matches!(inner.state, State::Connected(_)) {
        return fail(libc::ENOTCONN);
    }
    // SAFETY: caller contract of the entry points.
    unsafe { copy_addr(&storage, addr, len) };
    0
}

/// `rgetpeername`.
///
/// # Safety
/// `addr` writable for `*addrlen` bytes; `addrlen` valid.
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    guard("rgetpeername", -1, || name(socket, addr, addrlen, true))
}

/// `rgetsockname`.
///
/// # Safety
/// As `rgetpeername`.
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    guard("rgetsockname", -1, || name(socket, addr, addrlen, false))
}

/// Reads an `int` option value.
///
/// # Safety
/// `value` readable for `len` bytes.
unsafe fn int_value(value: *const c_void, len: socklen_t) -> Result<c_int, c_int> {
    if value.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller contract; at least an int's bytes.
    Ok(unsafe { value.cast::<c_int>().read_unaligned() })
}

/// `rsetsockopt`: the options rdma-core's rsockets take (see the capi README).
///
/// # Safety
/// `value` readable for `len` bytes.
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    option: c_int,
    value: *const c_void,
    len: socklen_t,
) -> c_int {
    guard("rsetsockopt", -1, || {
        let s = match socket_of(socket) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        // SAFETY: caller contract.
        let v = match unsafe { int_value(value, len) } {
            Ok(v) => v,
            Err(e) if level == libc::SOL_SOCKET && option == libc::SO_LINGER => {
                let _ = e;
                0
            }
            Err(e) => return fail(e),
        };
        let mut inner = s.inner.lock();
        let unopened = matches!(inner.state, State::Init | State::Bound | State::Listening);
        let o = &mut inner.opts;
        match (level, option) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
                let id = inner.id;
                inner.opts.reuseaddr = v != 0;
                let mut val = v;
                // SAFETY: our live id; `val` a local int. Failures are tolerated, as by
                // rdma-core (the id may already be bound).
                unsafe {
                    rdma_set_option(
                        id,
                        RDMA_OPTION_ID as c_int,
                        RDMA_OPTION_ID_REUSEADDR as c_int,
                        std::ptr::from_mut(&mut val).cast(),
                        std::mem::size_of::<c_int>(),
                    )
                };
                return 0;
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) if unopened => {
                o.rbuf_size = (v.max(1) as u32).saturating_mul(2)
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) if unopened => {
                o.sbuf_size = (v as u32).saturating_mul(2).max(4096)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF | libc::SO_SNDBUF) => {}
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                // SAFETY: caller contract: a `struct linger` when long enough.
                o.linger = len as usize >= std::mem::size_of::<libc::linger>()
                    && unsafe { value.cast::<libc::linger>().read_unaligned() }.l_onoff != 0;
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keepalive = v != 0,
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => o.oobinline = v != 0,
            (libc::IPPROTO_IP, libc::IP_TOS) => o.tos = v as u8,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.nodelay = v != 0,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG | libc::TCP_CONGESTION) => {}
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) if v > 0 => o.keepalive_time = v as u32,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => {}
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => o.afonly = v != 0,
            (SOL_RDMA, RDMA_SQSIZE) if unopened => o.sq_size = (v as u32).min(0xfffe),
            (SOL_RDMA, RDMA_RQSIZE) if unopened => o.rq_size = (v as u32).min(0xfffe),
            (SOL_RDMA, RDMA_INLINE) if unopened => o.inline = (v as u32).min(0xfffe),
            (SOL_RDMA, RDMA_IOMAPSIZE) if unopened => {
                o.iomap_size = scale_to_value(value_to_scale((v as u32).min(0xffff), 8), 8)
            }
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE) => {
                return fail(libc::EINVAL)
            }
            _ => return fail(libc::ENOTSUP),
        }
        0
    })
}

/// `rgetsockopt`.
///
/// # Safety
/// `value` writable for `*len` bytes; `len` valid.
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    option: c_int,
    value: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    guard("rgetsockopt", -1, || {
        let s = match socket_of(socket) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        if value.is_null() || len.is_null() {
            return fail(libc::EINVAL);
        }
        let mut inner = s.inner.lock();
        let o = inner.opts;
        let int = match (level, option) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => c_int::from(o.reuseaddr),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.rbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.sbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => c_int::from(o.keepalive),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => c_int::from(o.oobinline),
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                let flow_err = inner.flow().map_or(0, |f| std::mem::take(&mut f.err));
                if flow_err != 0 {
                    flow_err
                } else {
                    std::mem::take(&mut inner.err)
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let linger = libc::linger {
                    l_onoff: c_int::from(o.linger),
                    l_linger: 0,
                };
                // SAFETY: caller contract.
                unsafe {
                    let room = (*len as usize).min(std::mem::size_of::<libc::linger>());
                    std::ptr::copy_nonoverlapping(
                        std::ptr::from_ref(&linger).cast::<u8>(),
                        value.cast::<u8>(),
                        room,
                    );
                    *len = std::mem::size_of::<libc::linger>() as socklen_t;
                }
                return 0;
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => c_int::from(o.tos),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => c_int::from(o.nodelay),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => o.keepalive_time as c_int,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => c_int::from(o.afonly),
            (SOL_RDMA, RDMA_SQSIZE) => o.sq_size as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => o.rq_size as c_int,
            (SOL_RDMA, RDMA_INLINE) => o.inline as c_int,
            (SOL_RDMA, RDMA_IOMAPSIZE) => o.iomap_size as c_int,
            _ => return fail(libc::ENOTSUP),
        };
        // SAFETY: caller contract.
        unsafe {
            if (*len as usize) < std::mem::size_of::<c_int>() {
                return fail(libc::EINVAL);
            }
            value.cast::<c_int>().write_unaligned(int);
            *len = std::mem::size_of::<c_int>() as socklen_t;
        }
        0
    })
}

/// `rfcntl`: `F_GETFL`/`F_SETFL` (`O_NONBLOCK`) and `F_GETFD`/`F_SETFD`; others `ENOTSUP`.
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_long) -> c_int {
    guard("rfcntl", -1, || {
        let s = match socket_of(socket) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        let mut inner = s.inner.lock();
        match cmd {
            libc::F_GETFL => inner.opts.fs_flags,
            libc::F_SETFL => {
                inner.opts.fs_flags = arg as c_int;
                if matches!(inner.state, State::Listening) {
                    let nonblocking = inner.opts.nonblocking();
                    super::endpoint::set_nonblocking(inner.cm_fd(), nonblocking);
                }
                0
            }
            libc::F_GETFD => inner.opts.fd_flags,
            libc::F_SETFD => {
                inner.opts.fd_flags = arg as c_int;
                0
            }
            _ => fail(libc::ENOTSUP),
        }
    })
}

/// `riomap`: not provided (`ENOSYS`).
pub extern "C" fn riomap(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _prot: c_int,
    _flags: c_int,
    _offset: libc::off_t,
) -> libc::off_t {
    fail(libc::ENOSYS)
}

/// `riounmap`: not provided (`ENOSYS`).
pub extern "C" fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
    fail(libc::ENOSYS)
}

/// `riowrite`: not provided (`ENOSYS`; rdma-core's failure with nothing written is
/// `(size_t) -1`).
pub extern "C" fn riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: libc::off_t,
    _flags: c_int,
) -> usize {
    set_errno(libc::ENOSYS);
    usize::MAX
}

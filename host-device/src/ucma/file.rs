//! One open `/dev/infiniband/rdma_cm`: a set of rdma_cm ids and the commands that drive them.
//!
//! Ids are numbers of this file: the kernel refuses another file's (EINVAL), and closing the
//! file destroys every id it holds, connections and pending requests included. The backend
//! keeps one file per guest context for that reason. The file is opened non-blocking: GET_EVENT
//! answers `None` when no event is queued, and the fd polls readable while one is.

use std::fs::OpenOptions;
use std::net::{IpAddr, SocketAddr};

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use vrdma_spec::cm::sockaddr;

use vrdma_spec::verbs::QpState;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::abi::*;
use crate::cm::CmId;
use crate::error::{DeviceError, Result};
use crate::verbs_file::write_command;

/// Where the kernel's rdma_cm character device lives.
pub const CM_DEVICE_PATH: &str = "/dev/infiniband/rdma_cm";

/// An open rdma_cm character device.
#[derive(Debug)]
pub struct CmFile {
    fd: OwnedFd,
}

impl CmFile {
    /// Opens the device read/write, non-blocking, close-on-exec. Commands must be written
    /// under the credentials that opened it (the kernel checks, EACCES).
    pub fn open(path: &Path) -> Result<CmFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|source| DeviceError::Open {
                path: path.to_owned(),
                source,
            })?;
        Ok(CmFile { fd: file.into() })
    }

    /// CREATE_ID in port space `ps` (see [`port_space`]); `uid` comes back in every event of
    /// the id and must not be 0 (the kernel drops events of ids whose uid is 0).
    pub fn create_id(&self, uid: u64, ps: u16, qp_type: u8) -> Result<CmId> {
        let mut resp = CreateIdResp::new_zeroed();
        let req = CreateId {
            uid,
            response: response_ptr(&mut resp),
            ps,
            qp_type,
            reserved: [0; 5],
        };
        self.write("CREATE_ID", cmd::CREATE_ID, &req, size_of::<CreateIdResp>())?;
        Ok(CmId(resp.id))
    }

    /// DESTROY_ID: the id goes (with its connection); returns how many of its events GET_EVENT
    /// had reported.
    pub fn destroy_id(&self, id: CmId) -> Result<u32> {
        let mut resp = DestroyIdResp::new_zeroed();
        let req = DestroyId {
            response: response_ptr(&mut resp),
            id: id.0,
            reserved: 0,
        };
        self.write(
            "DESTROY_ID",
            cmd::DESTROY_ID,
            &req,
            size_of::<DestroyIdResp>(),
        )?;
        Ok(resp.events_reported)
    }

    /// BIND to `addr` (a link-local IPv6 address needs the host interface's scope id).
    pub fn bind(&self, id: CmId, addr: &SocketAddr) -> Result<()> {
        let (addr, addr_size) = encode_sockaddr(addr);
        let req = Bind {
            id: id.0,
            addr_size,
            reserved: 0,
            addr,
        };
        self.write("BIND", cmd::BIND, &req, 0)
    }

    /// RESOLVE_ADDR from `src` (or a source the route picks) to `dst`; ADDR_RESOLVED or
    /// ADDR_ERROR follows.
    pub fn resolve_addr(
        &self,
        id: CmId,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout_ms: u32,
    ) -> Result<()> {
        let (src_addr, src_size) = src.map_or(([0; SOCKADDR_STORAGE], 0), encode_sockaddr);
        let (dst_addr, dst_size) = encode_sockaddr(dst);
        let req = ResolveAddr {
            id: id.0,
            timeout_ms,
            src_size,
            dst_size,
            reserved: 0,
            src_addr,
            dst_addr,
        };
        self.write("RESOLVE_ADDR", cmd::RESOLVE_ADDR, &req, 0)
    }

    /// RESOLVE_ROUTE; ROUTE_RESOLVED or ROUTE_ERROR follows.
    pub fn resolve_route(&self, id: CmId, timeout_ms: u32) -> Result<()> {
        let req = ResolveRoute {
            id: id.0,
            timeout_ms,
        };
        self.write("RESOLVE_ROUTE", cmd::RESOLVE_ROUTE, &req, 0)
    }

    /// QUERY(ADDR): the id's addresses, device GUID and port.
    pub fn query_addr(&self, id: CmId) -> Result<QueryAddrResp> {
        let mut resp = QueryAddrResp::new_zeroed();
        let req = Query {
            response: response_ptr(&mut resp),
            id: id.0,
            option: query::ADDR,
        };
        self.write("QUERY", cmd::QUERY, &req, size_of::<QueryAddrResp>())?;
        Ok(resp)
    }

    /// LISTEN with `backlog` pending requests at most.
    pub fn listen(&self, id: CmId, backlog: u32) -> Result<()> {
        let req = Listen { id: id.0, backlog };
        self.write("LISTEN", cmd::LISTEN, &req, 0)
    }

    /// CONNECT with `param` (`valid` must be 1; `qp_num` is the host QP the peer will aim at).
    pub fn connect(&self, id: CmId, param: &ConnParam) -> Result<()> {
        let req = Connect {
            conn_param: *param,
            id: id.0,
            reserved: 0,
            ece: Ece::new_zeroed(),
        };
        self.write("CONNECT", cmd::CONNECT, &req, 0)
    }

    /// ACCEPT a connect request with `param` (`valid` 1; `uid` becomes the new id's), or with
    /// `valid` 0 accept the peer's reply and establish (the RTU of `rdma_establish`).
    pub fn accept(&self, id: CmId, uid: u64, param: &ConnParam) -> Result<()> {
        let req = Accept {
            uid,
            conn_param: *param,
            id: id.0,
            reserved: 0,
            ece: Ece::new_zeroed(),
        };
        self.write("ACCEPT", cmd::ACCEPT, &req, 0)
    }

    /// REJECT a connect request (or reply) with `private_data` (at most 256 bytes; the CM's
    /// message limits apply).
    pub fn reject(&self, id: CmId, reason: u8, private_data: &[u8]) -> Result<()> {
        let mut req = Reject {
            id: id.0,
            private_data_len: 0,
            reason,
            reserved: [0; 2],
            private_data: [0; MAX_PRIVATE_DATA],
        };
        req.private_data_len = copy_private_data(&mut req.private_data, private_data);
        self.write("REJECT", cmd::REJECT, &req, 0)
    }

    /// DISCONNECT; DISCONNECTED follows on both sides.
    pub fn disconnect(&self, id: CmId) -> Result<()> {
        self.write("DISCONNECT", cmd::DISCONNECT, &Disconnect { id: id.0 }, 0)
    }

    /// INIT_QP_ATTR: the attributes and mask that move the id's QP to `state`.
    pub fn init_qp_attr(&self, id: CmId, state: QpState) -> Result<QpAttrResp> {
        let mut resp = QpAttrResp::new_zeroed();
        let req = InitQpAttr {
            response: response_ptr(&mut resp),
            id: id.0,
            qp_state: state as u32,
        };
        self.write(
            "INIT_QP_ATTR",
            cmd::INIT_QP_ATTR,
            &req,
            size_of::<QpAttrResp>(),
        )?;
        Ok(resp)
    }

    /// GET_EVENT: the next event of any id of this file, `None` when none is queued.
    pub fn get_event(&self) -> Result<Option<EventResp>> {
        let mut resp = EventResp::new_zeroed();
        let req = GetEvent {
            response: response_ptr(&mut resp),
        };
        match self.write("GET_EVENT", cmd::GET_EVENT, &req, size_of::<EventResp>()) {
            Ok(()) => Ok(Some(resp)),
            Err(DeviceError::Command { errno, .. }) if errno == libc::EAGAIN => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// SET_OPTION `name` of `level` to `value` (the kernel takes exactly the option's size).
    pub fn set_option(&self, id: CmId, level: u32, name: u32, value: &[u8]) -> Result<()> {
        let req = SetOption {
            optval: value.as_ptr() as u64,
            id: id.0,
            level,
            optname: name,
            optlen: value.len() as u32,
        };
        self.write("SET_OPTION", cmd::SET_OPTION, &req, 0)
    }

    /// NOTIFY the CM of a QP event (`IB_EVENT_COMM_EST` is the one it acts on).
    pub fn notify(&self, id: CmId, event: u32) -> Result<()> {
        self.write("NOTIFY", cmd::NOTIFY, &Notify { id: id.0, event }, 0)
    }

    /// Writes header + `req`; `out_len` is the size of what `req`'s response pointer points
    /// at (0 for none).
    fn write<T: IntoBytes + Immutable>(
        &self,
        name: &'static str,
        cmd: u32,
        req: &T,
        out_len: usize,
    ) -> Result<()> {
        let hdr = CmHdr {
            cmd,
            in_len: size_of::<T>() as u16,
            out_len: out_len as u16,
        };
        let mut buf = Vec::with_capacity(size_of::<CmHdr>() + size_of::<T>());
        buf.extend_from_slice(hdr.as_bytes());
        buf.extend_from_slice(req.as_bytes());
        // SAFETY: the user addresses the request carries point at live buffers of the caller
        // for the duration of this call: a response of exactly `out_len` bytes, or
        // SET_OPTION's value of `optlen` bytes (read only).
        unsafe { write_command(self.fd.as_fd(), name, &buf) }
    }
}

impl AsFd for CmFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The user address of a response buffer.
fn response_ptr<T: FromBytes + IntoBytes + KnownLayout>(resp: &mut T) -> u64 {
    resp.as_mut_bytes().as_mut_ptr() as u64
}

/// Copies up to [`MAX_PRIVATE_DATA`] bytes of `data`; returns how many.
pub fn copy_private_data(to: &mut [u8; MAX_PRIVATE_DATA], data: &[u8]) -> u8 {
    let len = data.len().min(MAX_PRIVATE_DATA - 1);
    to[..len].copy_from_slice(&data[..len]);
    len as u8
}

/// `addr` as a `sockaddr_in`/`sockaddr_in6` in a `__kernel_sockaddr_storage`, with its size.
pub fn encode_sockaddr(addr: &SocketAddr) -> ([u8; SOCKADDR_STORAGE], u16) {
    let (storage, len) = sockaddr::encode(addr);
    (storage, len as u16)
}

/// The address of a `__kernel_sockaddr_storage` the kernel filled in; `None` for a family
/// other than IPv4/IPv6 (AF_IB) or a size that does not match it.
pub fn decode_sockaddr(storage: &[u8; SOCKADDR_STORAGE], size: u16) -> Option<SocketAddr> {
    sockaddr::decode(storage, size.into())
}

/// The connection parameters of an event about a connected (RC/UC) id.
pub fn event_conn_param(event: &EventResp) -> ConnParam {
    ConnParam::read_from_prefix(&event.param)
        .expect("the union holds a ConnParam")
        .0
}

/// `ip` as the GID rxe gives it (IPv4 addresses mapped).
pub fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_the_kernels_storage() {
        for text in ["192.0.2.7:4791", "[fe80::a:1%3]:18515", "[2001:db8::1]:1"] {
            let addr: SocketAddr = text.parse().unwrap();
            let (storage, size) = encode_sockaddr(&addr);
            assert_eq!(decode_sockaddr(&storage, size), Some(addr), "{text}");
        }
        let (storage, size) = encode_sockaddr(&"[fe80::1%7]:2".parse().unwrap());
        assert_eq!(size, 28);
        assert_eq!(&storage[0..2], &10u16.to_ne_bytes(), "AF_INET6");
        assert_eq!(&storage[2..4], &[0, 2], "port in network order");
        assert_eq!(&storage[24..28], &7u32.to_ne_bytes(), "scope id");
        // A size that does not match the family, or AF_IB: not an address of ours.
        assert_eq!(decode_sockaddr(&storage, 16), None);
        let mut ib = [0u8; SOCKADDR_STORAGE];
        ib[0..2].copy_from_slice(&27u16.to_ne_bytes());
        assert_eq!(decode_sockaddr(&ib, 48), None);
    }

    #[test]
    fn private_data_is_cut_to_what_the_length_byte_can_say() {
        let mut to = [0u8; MAX_PRIVATE_DATA];
        assert_eq!(copy_private_data(&mut to, b"hello"), 5);
        assert_eq!(&to[..5], b"hello");
        assert_eq!(copy_private_data(&mut to, &[1; 300]), 255);
    }
}

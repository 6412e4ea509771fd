//! [`HostCm`] over an open rdma_cm device: the one conversion between the connection
//! manager's host types ([`crate::cm`]) and the kernel's ucma ABI.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use vrdma_spec::cm::{cm_option, cm_port_space};
use vrdma_spec::verbs::{QpAttrMask, QpState};
use vrdma_spec::wire::QpAttr;
use zerocopy::FromBytes;

use super::abi::{option, ConnParam, EventResp, UdParam};
use super::file::{decode_sockaddr, CmFile};
use crate::cm::*;
use crate::error::Result;
use crate::rxe_convert::{qp_attr_from_cm, wire_ah_attr};

/// `IB_QPT_RC`, `IB_QPT_UD`: the QP type CREATE_ID names (the kernel derives it from the port
/// space for the two a guest may use, but checks it is given).
const IB_QPT_RC: u8 = 2;
const IB_QPT_UD: u8 = 4;

/// A guest's connection manager on the host kernel: one open `/dev/infiniband/rdma_cm`.
#[derive(Debug)]
pub struct KernelCm {
    file: CmFile,
}

impl KernelCm {
    /// Opens the rdma_cm device at `path`.
    pub fn open(path: &Path) -> Result<KernelCm> {
        Ok(KernelCm {
            file: CmFile::open(path)?,
        })
    }
}

fn kernel_conn_param(p: &ConnParams, valid: bool) -> ConnParam {
    ConnParam {
        qp_num: p.qp_num,
        qkey: 0,
        private_data: *p.private_data.padded(),
        private_data_len: p.private_data.len(),
        srq: u8::from(p.srq),
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        valid: u8::from(valid),
    }
}

/// The peer's private data as the kernel gave it: its length cut to the buffer.
fn private_data(bytes: &[u8], len: u8) -> PrivateData {
    PrivateData::new(&bytes[..usize::from(len).min(bytes.len())])
}

fn event_params(e: &EventResp) -> EventParams {
    let (conn, _) = ConnParam::read_from_prefix(&e.param).expect("the union holds a ConnParam");
    let (ud, _) = UdParam::read_from_prefix(&e.param).expect("the union holds a UdParam");
    EventParams {
        conn: ConnParams {
            qp_num: conn.qp_num,
            srq: conn.srq != 0,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            flow_control: conn.flow_control,
            retry_count: conn.retry_count,
            rnr_retry_count: conn.rnr_retry_count,
            private_data: private_data(&conn.private_data, conn.private_data_len),
        },
        ud: UdPeer {
            qp_num: ud.qp_num,
            qkey: ud.qkey,
            ah_attr: wire_ah_attr(&ud.ah_attr),
            private_data: private_data(&ud.private_data, ud.private_data_len),
        },
    }
}

impl HostCm for KernelCm {
    fn event_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn create_id(&self, uid: u64, port_space: u16) -> Result<CmId> {
        let qp_type = if port_space == cm_port_space::UDP {
            IB_QPT_UD
        } else {
            IB_QPT_RC
        };
        self.file.create_id(uid, port_space, qp_type)
    }

    fn destroy_id(&self, id: CmId) -> Result<()> {
        self.file.destroy_id(id).map(drop)
    }

    fn bind(&self, id: CmId, addr: &SocketAddr) -> Result<()> {
        self.file.bind(id, addr)
    }

    fn resolve_addr(
        &self,
        id: CmId,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout_ms: u32,
    ) -> Result<()> {
        self.file.resolve_addr(id, src, dst, timeout_ms)
    }

    fn resolve_route(&self, id: CmId, timeout_ms: u32) -> Result<()> {
        self.file.resolve_route(id, timeout_ms)
    }

    fn query_addr(&self, id: CmId) -> Result<CmAddresses> {
        let resp = self.file.query_addr(id)?;
        Ok(CmAddresses {
            src: decode_sockaddr(&resp.src_addr, resp.src_size),
            dst: decode_sockaddr(&resp.dst_addr, resp.dst_size),
        })
    }

    fn listen(&self, id: CmId, backlog: u32) -> Result<()> {
        self.file.listen(id, backlog)
    }

    fn connect(&self, id: CmId, params: &ConnParams) -> Result<()> {
        self.file.connect(id, &kernel_conn_param(params, true))
    }

    fn accept(&self, id: CmId, uid: u64, params: Option<&ConnParams>) -> Result<()> {
        let param = match params {
            Some(p) => kernel_conn_param(p, true),
            None => kernel_conn_param(&ConnParams::NONE, false),
        };
        self.file.accept(id, uid, &param)
    }

    fn reject(&self, id: CmId, reason: u8, private_data: &PrivateData) -> Result<()> {
        self.file.reject(id, reason, private_data.as_slice())
    }

    fn disconnect(&self, id: CmId) -> Result<()> {
        self.file.disconnect(id)
    }

    fn init_qp_attr(&self, id: CmId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        Ok(qp_attr_from_cm(&self.file.init_qp_attr(id, state)?))
    }

    fn get_event(&self) -> Result<Option<CmEvent>> {
        Ok(self.file.get_event()?.map(|e| CmEvent {
            uid: e.uid,
            id: CmId(e.id),
            event: e.event,
            status: e.status as i32,
            params: event_params(&e),
        }))
    }

    fn set_option(&self, id: CmId, opt: CmOption) -> Result<()> {
        // The kernel takes exactly each option's size: a byte for TOS and the ACK timeout, an
        // int for the two flags.
        let (name, int, byte);
        let value: &[u8] = match opt {
            CmOption::Tos(tos) => {
                name = cm_option::TOS;
                byte = [tos];
                &byte
            }
            CmOption::AckTimeout(timeout) => {
                name = cm_option::ACK_TIMEOUT;
                byte = [timeout];
                &byte
            }
            CmOption::ReuseAddr(on) => {
                name = cm_option::REUSEADDR;
                int = i32::from(on).to_ne_bytes();
                &int
            }
            CmOption::AfOnly(on) => {
                name = cm_option::AFONLY;
                int = i32::from(on).to_ne_bytes();
                &int
            }
        };
        self.file.set_option(id, option::LEVEL_ID, name, value)
    }

    fn notify(&self, id: CmId, event: u32) -> Result<()> {
        self.file.notify(id, event)
    }
}

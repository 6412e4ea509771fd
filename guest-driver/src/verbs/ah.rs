//! Address handles for UD sends.

use std::sync::Arc;

use log::warn;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::rxe_v1::RxeAv;
use vrdma_spec::wire::CreateAhReq;
use vrdma_spec::Le32;

use super::attr::AhAttr;
use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::error::{ProtocolError, Result};
use super::pd::{Pd, PdInner};
use crate::provider::rxe_v1::{RxeAddressHandle, RXE_AV_SIZE};
use crate::provider::UdDest;

/// An address handle (`ibv_ah`): where UD sends go. Destroyed when dropped.
pub struct Ah {
    object: AhObject,
    rxe: RxeAddressHandle,
}

struct AhObject {
    pd: Arc<PdInner>,
    handle: u32,
}

impl Drop for AhObject {
    fn drop(&mut self) {
        let req = ControlRequest::DestroyAh(handle_req(self.handle));
        if let Err(e) = self.pd.ctx.execute_empty(&req) {
            warn!("DESTROY_AH of AH {:#x} failed: {e}", self.handle);
        }
    }
}

impl Ah {
    /// Creates an address handle in `pd` (CREATE_AH; needs the UD feature).
    pub fn new(pd: &Pd, attr: &AhAttr) -> Result<Ah> {
        let req = ControlRequest::CreateAh(CreateAhReq {
            pd: Le32::new(pd.inner.handle),
            reserved: Le32::ZERO,
            ah_attr: attr.to_wire(),
        });
        let ResponseBody::CreateAh(resp) = pd.inner.ctx.execute(&req)? else {
            return Err(unexpected_body(Opcode::CreateAh));
        };
        let handle = nonzero_handle(Opcode::CreateAh, resp.ah.get())?;
        let object = AhObject {
            pd: pd.inner.clone(),
            handle,
        };
        let ah_num = resp.ah_num.get();
        if ah_num == 0 {
            // A device that cannot return an AH number must not offer UD (spec §7.4).
            return Err(ProtocolError::ResponseValue {
                opcode: Opcode::CreateAh,
                field: "ah_num",
                value: 0,
            }
            .into());
        }
        Ok(Ah {
            object,
            rxe: RxeAddressHandle {
                ah_num,
                av: av_bytes(&resp.av),
            },
        })
    }

    /// The device's handle of this AH.
    pub fn handle(&self) -> u32 {
        self.object.handle
    }

    /// What an rxe v1 UD send needs of this handle.
    pub fn rxe(&self) -> &RxeAddressHandle {
        &self.rxe
    }

    /// The destination of a UD send through this handle.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest<'_> {
        UdDest {
            ah: &self.rxe,
            remote_qpn,
            remote_qkey,
        }
    }
}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah")
            .field("handle", &self.object.handle)
            .field("ah_num", &self.rxe.ah_num)
            .finish()
    }
}

/// The bytes of `struct rxe_av` (spec §9.5).
fn av_bytes(av: &RxeAv) -> [u8; RXE_AV_SIZE] {
    let mut out = [0u8; RXE_AV_SIZE];
    out[0] = av.port_num;
    out[1] = av.network_type;
    out[2..8].copy_from_slice(&av.dmac);
    out[8..24].copy_from_slice(&av.dgid);
    out[24..28].copy_from_slice(&av.flow_label.get().to_le_bytes());
    out[28] = av.sgid_index;
    out[29] = av.hop_limit;
    out[30] = av.traffic_class;
    out[31] = av.pad;
    out[32..60].copy_from_slice(&av.sgid_addr);
    out[60..88].copy_from_slice(&av.dgid_addr);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn av_bytes_follow_the_rxe_layout() {
        let av = RxeAv {
            port_num: 1,
            network_type: 2,
            dmac: [1, 2, 3, 4, 5, 6],
            dgid: [0xfe; 16],
            flow_label: Le32::new(0x0102_0304),
            sgid_index: 7,
            hop_limit: 8,
            traffic_class: 9,
            pad: 0,
            sgid_addr: [0xaa; 28],
            dgid_addr: [0xbb; 28],
        };
        let b = av_bytes(&av);
        assert_eq!(&b[..8], &[1, 2, 1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[8..24], &[0xfe; 16]);
        assert_eq!(&b[24..28], &[4, 3, 2, 1]);
        assert_eq!(&b[28..32], &[7, 8, 9, 0]);
        assert_eq!(&b[32..60], &[0xaa; 28]);
        assert_eq!(&b[60..88], &[0xbb; 28]);
    }
}

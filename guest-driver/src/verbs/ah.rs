//! Address handles for UD sends.

use std::sync::Arc;

use log::warn;
use vrdma_spec::control::{ControlRequest, Opcode, ResponseBody};
use vrdma_spec::wire::{AhAttr, CreateAhReq};
use vrdma_spec::Le32;

use super::command::{handle_req, nonzero_handle, unexpected_body};
use super::error::{ProtocolError, Result};
use super::pd::{Pd, PdInner};
use crate::provider::rxe_v1::RxeAddressHandle;
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
            ah_attr: *attr,
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
        // With staged UD send queues the device translates the handle itself and never lets a
        // host `ah_num` through (spec §9.6); the WQE's own number is then the handle.
        let wqe_ah_num = if pd.inner.ctx.has_staged_ud() {
            handle
        } else {
            ah_num
        };
        Ok(Ah {
            object,
            rxe: RxeAddressHandle {
                ah_num: wqe_ah_num,
                av: resp.av,
            },
        })
    }

    /// The device's handle of this AH.
    pub fn handle(&self) -> u32 {
        self.object.handle
    }

    /// What an rxe v1 UD send needs of this handle: its `ah_num` is the number a UD WQE
    /// carries (the device's handle with `VRDMA_F_UD_STAGED_SQ`, else the host's number).
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

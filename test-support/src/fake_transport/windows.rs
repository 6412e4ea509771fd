//! Memory windows in the fake's loopback "kernel": BIND_MW, LOCAL_INV, the responder's side
//! of SEND_WITH_INV, and remote accesses through a window's rkey, with rxe's rules (a type-2
//! window binds only through a QP of its PD and is then usable only through that QP; only
//! type-2 windows can be invalidated; the MR must allow binding and cover the window).
//!
//! Stricter than rxe in two respects, as the InfiniBand rules are: the bound MR must be of the
//! binding QP's PD (rxe looks the MR up by lkey device-wide), and an access through a window
//! must lie inside the window (rxe checks only the MR's range); spec §12.

use vrdma::spec::rxe_v1::RxeSendWqe;
use vrdma::spec::verbs::{AccessFlags, MwType, WcStatus};

use super::device::{FakeDevice, FakeMr, MwBinding};

impl FakeDevice {
    /// Executes the bind of a BIND_MW WQE posted on QP `handle`; the completion status.
    pub(crate) fn bind_mw(&mut self, handle: u32, wqe: &RxeSendWqe) -> WcStatus {
        let qp = &self.qps[&handle];
        let (pd, qpn) = (qp.pd, qp.qpn);
        let bind = wqe.wr.wr.mw();
        let (mw_rkey, new_rkey) = (bind.mw_rkey.get(), bind.rkey.get());
        let (addr, len, access) = (bind.addr.get(), bind.length.get(), bind.access.get());
        let Some(mw_handle) = self.window_by_rkey(mw_rkey) else {
            return WcStatus::MwBindErr;
        };
        let mw = &self.mws[&mw_handle];
        let type2 = mw.mw_type == MwType::Type2;
        if type2 && (mw.binding.is_some() || mw.pd != pd || len == 0) {
            return WcStatus::MwBindErr;
        }
        let binding = if len == 0 {
            None
        } else {
            let lkey = bind.mr_lkey.get();
            let Some((&mr, found)) = self.mrs.iter().find(|(_, m)| m.lkey == lkey) else {
                return WcStatus::MwBindErr;
            };
            let writable = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
            let ok = found.pd == pd
                && found.access & AccessFlags::MW_BIND.bits() != 0
                && (access & writable.bits() == 0
                    || found.access & AccessFlags::LOCAL_WRITE.bits() != 0)
                && addr >= found.iova
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= found.iova + found.len);
            if !ok {
                return WcStatus::MwBindErr;
            }
            Some(MwBinding {
                mr,
                addr,
                len,
                access,
                qpn: type2.then_some(qpn),
            })
        };
        let mw = self.mws.get_mut(&mw_handle).unwrap();
        mw.rkey = (mw.rkey & !0xff) | (new_rkey & 0xff);
        mw.binding = binding;
        WcStatus::Success
    }

    /// Invalidates the type-2 window `rkey` (LOCAL_INV, or SEND_WITH_INV at the responder);
    /// whether there was such a bound window.
    pub(crate) fn invalidate(&mut self, rkey: u32) -> bool {
        let Some(handle) = self.window_by_rkey(rkey) else {
            return false;
        };
        let mw = self.mws.get_mut(&handle).unwrap();
        if mw.mw_type != MwType::Type2 || mw.binding.is_none() {
            return false;
        }
        mw.binding = None;
        true
    }

    /// The MR a remote access through QP `qpn` reaches with the window key `rkey`.
    pub(crate) fn remote_window(
        &self,
        qpn: u32,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u32,
        access: u32,
    ) -> Option<&FakeMr> {
        let mw = self.mws.values().find(|w| w.rkey == rkey && w.pd == pd)?;
        let b = mw.binding?;
        let through_its_qp = b.qpn.is_none_or(|bound| bound == qpn);
        let inside = addr >= b.addr && addr + u64::from(len) <= b.addr + b.len;
        (through_its_qp && inside && b.access & access == access)
            .then(|| self.mrs.get(&b.mr))
            .flatten()
    }

    fn window_by_rkey(&self, rkey: u32) -> Option<u32> {
        self.mws
            .iter()
            .find(|(_, w)| w.rkey == rkey)
            .map(|(h, _)| *h)
    }
}

/// The completion status of a failed LOCAL_INV (rxe: the WQE fails as a local QP error).
pub(crate) const LOCAL_INV_FAILED: WcStatus = WcStatus::LocQpOpErr;

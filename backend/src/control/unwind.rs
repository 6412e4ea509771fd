//! The one way a failed create gives back what it took.
//!
//! A create (CREATE_QP, CREATE_CQ, CREATE_SRQ, REG_MR, CREATE_AH) runs on an [`Unwind`] that
//! wraps its [`Session`]: each step it completes is recorded as an [`Undo`], and if the create
//! returns before [`Unwind::commit`] (any `?`), dropping the guard undoes the recorded steps in
//! reverse order. No create path releases anything by hand.

use std::ops::{Deref, DerefMut};

use log::warn;

use super::rings;
use super::session::Session;
use crate::host::{AhHandle, CqHandle, MrHandle, QpHandle, SrqHandle};
use crate::memory::mr_window::MrWindow;
use crate::memory::queue_region::MappedRing;
use crate::resources::table::Handle;

/// One completed step of a create, and what undoing it means.
#[derive(Debug)]
pub(super) enum Undo {
    /// A reserved doorbell slot: released.
    DoorbellSlot(u32),
    /// A reference taken on a PD, CQ or SRQ of the guest: dropped.
    PdRef(Handle),
    CqRef(Handle),
    SrqRef(Handle),
    /// A host object: destroyed.
    HostQp(QpHandle),
    HostCq(CqHandle),
    HostSrq(SrqHandle),
    HostMr(MrHandle),
    HostAh(AhHandle),
    /// Rings mapped into the guest's queue region (one SHMEM_UNMAP for all): unmapped.
    Rings(MappedRing, Option<MappedRing>),
    /// An MR window (charged to the guest's memory account): uncharged and unmapped.
    Window(MrWindow),
}

/// A create in progress on a session (see the module documentation). It dereferences to the
/// session, so the create is written as it would be without it.
pub(super) struct Unwind<'s, 'a> {
    session: &'s mut Session<'a>,
    done: Vec<Undo>,
}

impl<'s, 'a> Unwind<'s, 'a> {
    pub(super) fn new(session: &'s mut Session<'a>) -> Self {
        Unwind {
            session,
            done: Vec::new(),
        }
    }

    /// Records a completed step.
    pub(super) fn did(&mut self, step: Undo) {
        self.done.push(step);
    }

    /// Runs `acquire` (a reference on a guest object) and records it as `undo` on success.
    pub(super) fn take_ref<E>(
        &mut self,
        acquire: impl FnOnce(&mut Session<'a>) -> Result<(), E>,
        undo: Undo,
    ) -> Result<(), E> {
        acquire(self.session)?;
        self.did(undo);
        Ok(())
    }

    /// Takes the MR window back out of the guard, to move it into the object that owns it
    /// from now on (undoing the later steps then no longer unmaps it).
    pub(super) fn keep_window(&mut self) -> Option<MrWindow> {
        let index = self
            .done
            .iter()
            .rposition(|step| matches!(step, Undo::Window(_)))?;
        match self.done.remove(index) {
            Undo::Window(window) => Some(window),
            _ => None,
        }
    }

    /// The create succeeded: what it took belongs to the new object now.
    pub(super) fn commit(mut self) {
        self.done.clear();
    }

    fn undo(&mut self, step: Undo) {
        let s = &mut *self.session;
        let host = s.guest.host();
        let result = match step {
            Undo::DoorbellSlot(index) => {
                s.guest.doorbells().lock().release(index);
                Ok(())
            }
            Undo::PdRef(pd) => s.state.pds.release(pd).map_err(|e| e.to_string()),
            Undo::CqRef(cq) => s.state.cqs.release(cq).map_err(|e| e.to_string()),
            Undo::SrqRef(srq) => s.state.srqs.release(srq).map_err(|e| e.to_string()),
            Undo::HostQp(qp) => host
                .destroy_qp(qp)
                .map_err(|e| format!("host QP {qp}: {e}")),
            Undo::HostCq(cq) => host
                .destroy_cq(cq)
                .map_err(|e| format!("host CQ {cq}: {e}")),
            Undo::HostSrq(srq) => host
                .destroy_srq(srq)
                .map_err(|e| format!("host SRQ {srq}: {e}")),
            Undo::HostMr(mr) => host.dereg_mr(mr).map_err(|e| format!("host MR {mr}: {e}")),
            Undo::HostAh(ah) => host
                .destroy_ah(ah)
                .map_err(|e| format!("host AH {ah}: {e}")),
            Undo::Rings(first, second) => {
                rings::unmap_queue_rings(
                    Some(s.guest_io),
                    &mut s.state.shm,
                    &first,
                    second.as_ref(),
                );
                Ok(())
            }
            Undo::Window(window) => {
                s.state.unmap_window(window);
                Ok(())
            }
        };
        if let Err(e) = result {
            warn!("undoing a failed create: {e}");
        }
    }
}

impl<'a> Deref for Unwind<'_, 'a> {
    type Target = Session<'a>;

    fn deref(&self) -> &Session<'a> {
        self.session
    }
}

impl<'a> DerefMut for Unwind<'_, 'a> {
    fn deref_mut(&mut self) -> &mut Session<'a> {
        self.session
    }
}

impl Drop for Unwind<'_, '_> {
    fn drop(&mut self) {
        while let Some(step) = self.done.pop() {
            self.undo(step);
        }
    }
}

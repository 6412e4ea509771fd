//! What guest memory a process's command would make the device reach, checked against the
//! guest RAM the agent gave that process.
//!
//! A session's memory table also holds the agent's own region (the session's vrings and
//! command buffers), which the backend would let the session register; the agent refuses
//! every command that names guest memory outside the process's region, with the status the
//! device gives for memory outside guest RAM.

use vrdma_spec::control::ControlRequest;
use vrdma_spec::{ControlResponse, Status, StatusError};

/// The guest-physical range a process may make the device reach.
#[derive(Clone, Copy, Debug)]
pub struct Reach {
    start: u64,
    end: u64,
}

impl Reach {
    /// `len` bytes from `start`.
    pub fn new(start: u64, len: u64) -> Self {
        Reach {
            start,
            end: start.saturating_add(len),
        }
    }

    /// `None` if `request` may go to the device; else the response the device would give
    /// for memory outside guest RAM. Requests that do not decode go on: the device answers
    /// them with the status of their defect.
    pub fn refusal(&self, request: &[u8]) -> Option<Vec<u8>> {
        let inside = match ControlRequest::decode(request).ok()? {
            ControlRequest::RegMr(m) => self.pages_inside(m.pages.iter(), m.req.page_shift.get()),
            ControlRequest::ReregMr(m) if m.changes_translation() => {
                self.pages_inside(m.pages.iter(), m.req.page_shift.get())
            }
            ControlRequest::RegMrExtents(m) => {
                m.extents.iter().all(|(gpa, len)| self.covers(gpa, len))
            }
            ControlRequest::SetDoorbellArea(r) => {
                let bytes = vrdma_spec::doorbell::area_bytes(r.slots.get()) as u64;
                self.covers(r.gpa.get(), bytes)
            }
            _ => true,
        };
        (!inside).then(|| ControlResponse::Err(StatusError::new(Status::BadAddress)).to_vec())
    }

    fn pages_inside(&self, mut pages: impl Iterator<Item = u64>, shift: u32) -> bool {
        let size = 1u64.checked_shl(shift).unwrap_or(u64::MAX);
        pages.all(|gpa| self.covers(gpa, size))
    }

    fn covers(&self, gpa: u64, len: u64) -> bool {
        gpa >= self.start && gpa.checked_add(len).is_some_and(|end| end <= self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrdma_spec::control::{encode_extent_list, encode_page_list, RegMrExtents};
    use vrdma_spec::wire::{RegMrReq, SetDoorbellAreaReq};
    use vrdma_spec::{Le32, Le64, RegMr};
    use zerocopy::FromZeros;

    const START: u64 = 8 << 30;
    /// Not a multiple of 2 MiB, so that a 2 MiB page can reach past the end.
    const LEN: u64 = 63 << 20;

    fn reg_mr(pages: &[u64], shift: u32) -> Vec<u8> {
        let mut req = RegMrReq::new_zeroed();
        req.pd = Le32::new(1);
        req.length = Le64::new(pages.len() as u64 * (1 << shift));
        req.page_shift = Le32::new(shift);
        req.npages = Le32::new(pages.len() as u32);
        let mut list = Vec::new();
        encode_page_list(pages.iter().copied(), &mut list);
        ControlRequest::RegMr(RegMr::new(req, &list)).to_vec()
    }

    fn refused(request: &[u8]) -> bool {
        let refusal = Reach::new(START, LEN).refusal(request);
        if let Some(bytes) = &refusal {
            let status =
                ControlResponse::decode(ControlRequest::decode(request).unwrap().opcode(), bytes)
                    .unwrap()
                    .into_result()
                    .unwrap_err()
                    .status();
            assert_eq!(status, Status::BadAddress);
        }
        refusal.is_some()
    }

    #[test]
    fn only_the_processs_own_ram_can_be_reached() {
        assert!(!refused(&reg_mr(&[START, START + 4096], 12)));
        assert!(!refused(&reg_mr(&[START + LEN - 4096], 12)));
        // The agent's region below, the page after, a page straddling the end.
        assert!(refused(&reg_mr(&[1 << 30], 12)));
        assert!(refused(&reg_mr(&[START, START + LEN], 12)));
        // A 2 MiB page reaches all of it: the last one starts inside and ends outside.
        assert!(!refused(&reg_mr(&[START], 21)));
        assert!(refused(&reg_mr(&[START + (62 << 20)], 21)));

        let extents = |list: &[(u64, u64)]| {
            let mut req = RegMrReq::new_zeroed();
            req.pd = Le32::new(1);
            req.length = Le64::new(list.iter().map(|e| e.1).sum());
            req.page_shift = Le32::new(12);
            req.npages = Le32::new(list.len() as u32);
            let mut bytes = Vec::new();
            encode_extent_list(list.iter().copied(), &mut bytes);
            ControlRequest::RegMrExtents(RegMrExtents::new(req, &bytes)).to_vec()
        };
        assert!(!refused(&extents(&[(START, LEN)])));
        assert!(refused(&extents(&[(START, LEN + 4096)])));
        assert!(refused(&extents(&[(START, 4096), (START - 4096, 4096)])));

        let doorbell = |gpa: u64| {
            ControlRequest::SetDoorbellArea(SetDoorbellAreaReq {
                gpa: Le64::new(gpa),
                slots: Le32::new(1024),
                reserved: Le32::ZERO,
            })
            .to_vec()
        };
        assert!(!refused(&doorbell(START)));
        assert!(refused(&doorbell(1 << 30)));
        assert!(refused(&doorbell(START + LEN - 4096)));
        // Commands naming no guest memory, and bytes that do not decode, go on.
        assert!(!refused(&ControlRequest::QueryDevice.to_vec()));
        assert!(!refused(&[0xff; 3]));
    }
}

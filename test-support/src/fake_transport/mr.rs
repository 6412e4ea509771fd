//! The fake device's REREG_MR: a new PD or access in place with the same keys (as rxe), a new
//! translation with new keys (a new registration), checked as the backend checks it.

use vrdma::dma::PAGE_SIZE;
use vrdma::spec::control::{ReregMr, ResponseBody};
use vrdma::spec::wire::ReregMrResp;
use vrdma::spec::{Le32, Status};

use super::device::{Answer, FakeDevice};

impl FakeDevice {
    pub(crate) fn rereg_mr(&mut self, m: &ReregMr<'_>) -> Answer {
        let handle = m.req.mr.get();
        if !self.mrs.contains_key(&handle) {
            return Err(Status::BadHandle);
        }
        if let Some(pd) = m.new_pd() {
            if !self.pds.contains(&pd) {
                return Err(Status::BadHandle);
            }
        }
        let pages: Vec<u64> = m.pages.iter().collect();
        for &page in &pages {
            self.ram_range(page, PAGE_SIZE)?;
        }
        let new_keys = m.changes_translation().then(|| {
            self.next_key += 0x100;
            (self.next_key, self.next_key + 1)
        });
        let mr = self.mrs.get_mut(&handle).ok_or(Status::BadHandle)?;
        if let Some(pd) = m.new_pd() {
            mr.pd = pd;
        }
        if let Some(access) = m.new_access() {
            mr.access = access;
        }
        if let Some((lkey, rkey)) = new_keys {
            mr.iova = m.req.iova.get();
            mr.len = m.req.length.get();
            mr.pages = pages;
            (mr.lkey, mr.rkey) = (lkey, rkey);
        }
        Ok(ResponseBody::ReregMr(ReregMrResp {
            lkey: Le32::new(mr.lkey),
            rkey: Le32::new(mr.rkey),
        }))
    }
}

// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Per-guest quotas (spec §10): how many objects of each kind, and how many MR bytes, one
//! guest may hold.

use super::kind::{ResourceError, ResourceKind, MAX_OBJECTS_PER_TABLE};

/// Default per-guest mapping quota: two MRs at the default per-MR limit
/// ([`DEFAULT_MAX_MR_MAPPINGS`](crate::guest::options::DEFAULT_MAX_MR_MAPPINGS)), a third of
/// the daemon's default budget (`vm.max_map_count` 65530 less a quarter), so one guest
/// cannot take it all. MR windows and staged queues count against it together; a guest at its
/// default QP and CQ quotas, every queue staged, holds 3 · 4096 of it.
pub const DEFAULT_GUEST_MAPPINGS: u32 = 16 << 10;

/// Default per-guest QP quota, also of CQs and connection-manager ids: what a guest was
/// measured to hold through QEMU 11.1 (spec §10, queues of depth 1). The daemon's own mapping
/// of every staged queue is charged to the guest's mapping quota and the daemon's budget, so
/// guests at this quota cannot together reach `vm.max_map_count`.
pub const DEFAULT_GUEST_QPS: u32 = 4096;

/// Default per-guest CQ quota: as many as QPs.
pub const DEFAULT_GUEST_CQS: u32 = DEFAULT_GUEST_QPS;

/// Per-guest limits on the objects a guest may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Protection domains.
    pub pds: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Total bytes of all memory regions, `npages · page size` each (overlaps count again).
    pub mr_bytes: u64,
    /// Memory mappings all MR windows of the guest may hold together (spec §10).
    pub mappings: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Shared receive queues.
    pub srqs: u32,
    /// Address handles.
    pub ahs: u32,
    /// Memory windows (only with `VRDMA_F_MW`).
    pub mws: u32,
    /// Connection-manager ids (only with `VRDMA_F_CM`), connect requests not yet accepted
    /// included.
    pub cm_ids: u32,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            pds: 64,
            mrs: 4096,
            mr_bytes: 16 << 30,
            mappings: DEFAULT_GUEST_MAPPINGS,
            cqs: DEFAULT_GUEST_CQS,
            qps: DEFAULT_GUEST_QPS,
            srqs: 256,
            ahs: 4096,
            mws: 4096,
            cm_ids: DEFAULT_GUEST_QPS,
        }
    }
}

impl Quotas {
    /// Maximum number of objects of `kind`.
    pub fn count_limit(&self, kind: ResourceKind) -> u32 {
        match kind {
            ResourceKind::Pd => self.pds,
            ResourceKind::Mr => self.mrs,
            ResourceKind::Cq => self.cqs,
            ResourceKind::Qp => self.qps,
            ResourceKind::Srq => self.srqs,
            ResourceKind::Ah => self.ahs,
            ResourceKind::Mw => self.mws,
            ResourceKind::CmId => self.cm_ids,
        }
    }

    /// Maximum total bytes of objects of `kind` (only MRs are limited).
    pub fn byte_limit(&self, kind: ResourceKind) -> u64 {
        match kind {
            ResourceKind::Mr => self.mr_bytes,
            _ => u64::MAX,
        }
    }

    /// Checks that every limit fits in a table (for limits read from the command line).
    pub fn validate(&self) -> Result<(), ResourceError> {
        use ResourceKind::*;
        for kind in [Pd, Mr, Cq, Qp, Srq, Ah, Mw, CmId] {
            let limit = self.count_limit(kind);
            if limit > MAX_OBJECTS_PER_TABLE {
                return Err(ResourceError::LimitTooLarge { kind, limit });
            }
        }
        Ok(())
    }
}

// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! The kinds of guest objects the handle tables hold, and the errors of tables and quotas.

use std::fmt;

/// Largest number of objects one table can hold, leaving at least 8 bits of generation.
pub const MAX_OBJECTS_PER_TABLE: u32 = 1 << 24;

/// Kinds of guest-visible host objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// Protection domain.
    Pd,
    /// Memory region.
    Mr,
    /// Completion queue.
    Cq,
    /// Queue pair.
    Qp,
    /// Shared receive queue.
    Srq,
    /// Address handle.
    Ah,
    /// Memory window.
    Mw,
    /// Connection-manager id.
    CmId,
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceKind::Pd => "PD",
            ResourceKind::Mr => "MR",
            ResourceKind::Cq => "CQ",
            ResourceKind::Qp => "QP",
            ResourceKind::Srq => "SRQ",
            ResourceKind::Ah => "AH",
            ResourceKind::Mw => "MW",
            ResourceKind::CmId => "CM id",
        })
    }
}

/// Errors of handle tables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The handle does not name a live object of this table.
    #[error("unknown or stale {kind} handle {handle:#x}")]
    BadHandle {
        /// Table kind.
        kind: ResourceKind,
        /// The handle as given.
        handle: u32,
    },
    /// The table holds as many objects as its quota allows.
    #[error("{kind} quota exhausted: at most {limit} objects")]
    Quota {
        /// Table kind.
        kind: ResourceKind,
        /// Maximum number of objects.
        limit: u32,
    },
    /// The object would take the table's byte total over its quota.
    #[error("{kind} byte quota exhausted: {requested} more bytes would exceed the limit of {limit} bytes ({used} in use)")]
    ByteQuota {
        /// Table kind.
        kind: ResourceKind,
        /// Maximum number of bytes.
        limit: u64,
        /// Bytes already accounted.
        used: u64,
        /// Bytes requested.
        requested: u64,
    },
    /// The object is still referenced by other objects.
    #[error("{kind} {handle:#x} is still used by {refs} objects")]
    Busy {
        /// Table kind.
        kind: ResourceKind,
        /// The object's handle.
        handle: u32,
        /// Number of references held.
        refs: u32,
    },
    /// The object's reference count cannot grow any more.
    #[error("{kind} {handle:#x} has too many references")]
    TooManyRefs {
        /// Table kind.
        kind: ResourceKind,
        /// The object's handle.
        handle: u32,
    },
    /// A reference was released that was never acquired.
    #[error("{kind} {handle:#x} has no reference to release")]
    NotReferenced {
        /// Table kind.
        kind: ResourceKind,
        /// The object's handle.
        handle: u32,
    },
    /// A configured object limit is larger than a table can hold.
    #[error("{kind} limit {limit} exceeds the maximum of {MAX_OBJECTS_PER_TABLE}")]
    LimitTooLarge {
        /// Table kind.
        kind: ResourceKind,
        /// The configured limit.
        limit: u32,
    },
}

//! Flag sets: access flags, send and completion flags, and the MODIFY_QP / MODIFY_SRQ
//! attribute masks.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign, Not};

/// Defines a set of flag bits: a `u32` newtype with the shared constructors, queries and
/// operators. Each type defines its own checked `from_bits` (what "defined" means differs).
macro_rules! flag_set {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(u32);

        impl $name {
            /// No flag.
            pub const fn empty() -> Self {
                $name(0)
            }

            /// Exactly these bits, defined or not (for values already checked elsewhere, or
            /// passed through from the kernel unchanged).
            pub const fn from_bits_retain(bits: u32) -> Self {
                $name(bits)
            }

            /// The raw bits.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Whether every bit of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any bit of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }
        }

        impl BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        /// The complement over all 32 bits (undefined ones included).
        impl Not for $name {
            type Output = $name;
            fn not(self) -> $name {
                $name(!self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
    };
}

flag_set!(
    /// Memory-region and QP access flags (`ibv_access_flags`, the kernel's `IB_ACCESS_*`).
    AccessFlags
);

impl AccessFlags {
    /// Local write access (required by remote write and remote atomic).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1 << 0);
    /// Remote RDMA write access.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// Remote RDMA read access.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// Remote atomic access.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// Memory windows may be bound to the MR (REG_MR with `VRDMA_F_MW` only).
    pub const MW_BIND: AccessFlags = AccessFlags(1 << 4);
    /// Zero-based addressing (not supported by vrdma 1.0 MRs; a bind may ask for it).
    pub const ZERO_BASED: AccessFlags = AccessFlags(1 << 5);
    /// On-demand paging: the host does not pin the MR's pages (REG_MR and REREG_MR with
    /// `VRDMA_F_ODP` only).
    pub const ON_DEMAND: AccessFlags = AccessFlags(1 << 6);
    /// A QP or an MR lets peers FLUSH to global visibility (rxe's RDMA FLUSH).
    pub const FLUSH_GLOBAL: AccessFlags = AccessFlags(1 << 8);
    /// A QP or an MR lets peers FLUSH to persistence (rxe registers such an MR only on
    /// persistent memory: EINVAL otherwise).
    pub const FLUSH_PERSISTENT: AccessFlags = AccessFlags(1 << 9);
    /// Relaxed ordering (optional hint; the device may ignore it).
    pub const RELAXED_ORDERING: AccessFlags = AccessFlags(1 << 20);
    /// Flags REG_MR accepts.
    pub const MR_ALLOWED: AccessFlags = AccessFlags(
        Self::LOCAL_WRITE.0
            | Self::REMOTE_WRITE.0
            | Self::REMOTE_READ.0
            | Self::REMOTE_ATOMIC.0
            | Self::MW_BIND.0
            | Self::ON_DEMAND.0
            | Self::FLUSH_GLOBAL.0
            | Self::FLUSH_PERSISTENT.0
            | Self::RELAXED_ORDERING.0,
    );
    /// Flags a memory-window bind may give the window (rxe's `RXE_ACCESS_SUPPORTED_MW`
    /// without its local-only bits).
    pub const MW_ALLOWED: AccessFlags = AccessFlags(
        Self::LOCAL_WRITE.0
            | Self::REMOTE_WRITE.0
            | Self::REMOTE_READ.0
            | Self::REMOTE_ATOMIC.0
            | Self::ZERO_BASED.0,
    );
    /// Flags MODIFY_QP (`IBV_QP_ACCESS_FLAGS`) accepts. `ON_DEMAND` means nothing on a QP; the
    /// kernel keeps it as given, and programs that give a QP their MR's access (rdma-core's
    /// ODP tests) set it.
    pub const QP_ALLOWED: AccessFlags = AccessFlags(
        Self::LOCAL_WRITE.0
            | Self::REMOTE_WRITE.0
            | Self::REMOTE_READ.0
            | Self::REMOTE_ATOMIC.0
            | Self::ON_DEMAND.0
            | Self::FLUSH_GLOBAL.0
            | Self::FLUSH_PERSISTENT.0,
    );

    /// QP access flags from `ibv_access_flags` bits; `None` if a bit is not one a QP carries
    /// (outside [`AccessFlags::QP_ALLOWED`]).
    pub const fn qp_from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::QP_ALLOWED.0 == 0 {
            Some(AccessFlags(bits))
        } else {
            None
        }
    }

    /// Flags from `ibv_access_flags` bits; `None` if a bit is not one vrdma carries (outside
    /// [`AccessFlags::MR_ALLOWED`]).
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::MR_ALLOWED.0 == 0 {
            Some(AccessFlags(bits))
        } else {
            None
        }
    }
}

flag_set!(
    /// Send flags (`ibv_send_flags`), as written into `rxe_send_wr.send_flags`.
    SendFlags
);

impl SendFlags {
    /// Wait for earlier RDMA reads and atomics to complete first.
    pub const FENCE: SendFlags = SendFlags(1 << 0);
    /// Generate a completion for this work request.
    pub const SIGNALED: SendFlags = SendFlags(1 << 1);
    /// Set the solicited-event bit in the last packet.
    pub const SOLICITED: SendFlags = SendFlags(1 << 2);
    /// Copy the payload into the work request; the buffers need no memory region.
    pub const INLINE: SendFlags = SendFlags(1 << 3);
    /// Every flag a work request may carry (what rxe's queue accepts).
    pub const ALL: SendFlags =
        SendFlags(Self::FENCE.0 | Self::SIGNALED.0 | Self::SOLICITED.0 | Self::INLINE.0);

    /// Flags from their `ibv_send_flags` bits; `None` if a bit is not one of [`Self::ALL`].
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 == 0 {
            Some(SendFlags(bits))
        } else {
            None
        }
    }
}

flag_set!(
    /// Completion flags (`ibv_wc_flags`), kept exactly as the device wrote them.
    ///
    /// Soft-RoCE writes the kernel's `ib_wc_flags` into user CQEs and rdma-core's rxe
    /// provider hands them over unchanged. The two agree on [`WcFlags::GRH`] and
    /// [`WcFlags::WITH_IMM`]. For a received SEND_WITH_INVALIDATE the kernel sets its
    /// `IB_WC_WITH_INVALIDATE` (bit 2), the bit ibverbs calls [`WcFlags::IP_CSUM_OK`]; the
    /// guest's rxe provider translates that one bit into [`WcFlags::WITH_INV`], which
    /// rdma-core's does not (rxe never reports a checksum result, so bit 2 can mean nothing
    /// else).
    WcFlags
);

impl WcFlags {
    /// A GRH is present in the first 40 bytes of the receive buffer (UD).
    pub const GRH: WcFlags = WcFlags(1 << 0);
    /// `imm_data` is valid.
    pub const WITH_IMM: WcFlags = WcFlags(1 << 1);
    /// IP checksum verified (ibverbs name of bit 2, see the type's documentation).
    pub const IP_CSUM_OK: WcFlags = WcFlags(1 << 2);
    /// `imm_data` holds an invalidated rkey (ibverbs name of bit 3).
    pub const WITH_INV: WcFlags = WcFlags(1 << 3);
}

flag_set!(
    /// Which QP attributes MODIFY_QP applies / QUERY_QP returns (`ibv_qp_attr_mask`).
    QpAttrMask
);

impl QpAttrMask {
    /// `qp_state`.
    pub const STATE: QpAttrMask = QpAttrMask(1 << 0);
    /// `cur_qp_state`.
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    /// `en_sqd_async_notify`.
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    /// `qp_access_flags`.
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// `pkey_index`.
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// `port_num`.
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// `qkey`.
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// `ah_attr` (primary address vector).
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// `path_mtu`.
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// `timeout`.
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// `retry_cnt`.
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// `rnr_retry`.
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// `rq_psn`.
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// `max_rd_atomic`.
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    /// `min_rnr_timer`.
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// `sq_psn`.
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// `max_dest_rd_atomic`.
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// `path_mig_state`.
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    /// `cap` (never valid in MODIFY_QP: queues are not resizable).
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    /// `dest_qp_num`.
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);
    /// `rate_limit` (never valid for RC/UD).
    pub const RATE_LIMIT: QpAttrMask = QpAttrMask(1 << 25);
    /// Every bit the kernel's legacy MODIFY_QP / QUERY_QP commands take (`STATE` through
    /// `DEST_QPN`; `RATE_LIMIT` needs the extended command).
    pub const LEGACY_ALL: QpAttrMask = QpAttrMask((1 << 21) - 1);
    /// Every bit defined by this version; the others are reserved.
    pub const ALL: QpAttrMask = QpAttrMask(Self::LEGACY_ALL.0 | Self::RATE_LIMIT.0);

    /// A mask from raw bits; `None` if a bit is not defined (outside [`QpAttrMask::ALL`]).
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 == 0 {
            Some(QpAttrMask(bits))
        } else {
            None
        }
    }
}

/// MODIFY_SRQ `attr_mask` bits (`ibv_srq_attr_mask`).
pub mod srq_attr {
    /// Resize (`max_wr`); answered with UNSUPPORTED by vrdma 1.0.
    pub const MAX_WR: u32 = 1 << 0;
    /// Arm the limit event (`srq_limit`).
    pub const LIMIT: u32 = 1 << 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_keep_ibverbs_values() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(f.bits(), 0x7);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 0x8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
        assert_eq!(AccessFlags::from_bits(0x7), Some(f));
        assert_eq!(
            AccessFlags::from_bits(AccessFlags::MW_BIND.bits()),
            Some(AccessFlags::MW_BIND)
        );
        assert_eq!(AccessFlags::MR_ALLOWED.bits(), 0x35f | (1 << 20));
        assert_eq!(AccessFlags::MW_ALLOWED.bits(), 0x2f);
        assert_eq!(AccessFlags::QP_ALLOWED.bits(), 0x34f);
        assert_eq!(AccessFlags::from_bits(AccessFlags::ZERO_BASED.bits()), None);
        assert_eq!(AccessFlags::qp_from_bits(AccessFlags::MW_BIND.bits()), None);
        assert_eq!(AccessFlags::from_bits(1 << 31), None);
        assert_eq!(AccessFlags::from_bits_retain(1 << 31).bits(), 1 << 31);
        let mut g = AccessFlags::empty();
        g |= AccessFlags::REMOTE_READ;
        assert!(f.contains(g) && !g.contains(f) && g.intersects(f));
        assert_eq!(format!("{f:?}"), "AccessFlags(0x7)");
    }

    #[test]
    fn qp_attr_masks_keep_ibverbs_values() {
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::LEGACY_ALL.bits(), (1 << 21) - 1);
        assert_eq!(QpAttrMask::ALL.bits(), ((1 << 21) - 1) | (1 << 25));
        assert_eq!(
            QpAttrMask::from_bits(QpAttrMask::ALL.bits()),
            Some(QpAttrMask::ALL)
        );
        assert_eq!(QpAttrMask::from_bits(1 << 21), None);
        assert_eq!(QpAttrMask::from_bits_retain(1 << 21).bits(), 1 << 21);
        assert!(!QpAttrMask::LEGACY_ALL.contains(QpAttrMask::RATE_LIMIT));
        assert!((!QpAttrMask::LEGACY_ALL).contains(QpAttrMask::RATE_LIMIT));
        let m = QpAttrMask::STATE | QpAttrMask::AV;
        assert_eq!(m & QpAttrMask::AV, QpAttrMask::AV);
        assert_eq!(format!("{m:?}"), "QpAttrMask(0x81)");
    }
}

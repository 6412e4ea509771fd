//! A CQ slot: its entry size ([`CQE_SIZE`]) and its user half (`struct ib_uverbs_wc`), as the
//! host kernel writes it.

use crate::{Le16, Le32, Le64};

wire_struct! {
    /// `struct ib_uverbs_wc`, 48 bytes (same layout as `ibv_wc`); the slot is larger.
    pub struct IbUverbsWc {
        /// `wr_id` of the completed request.
        pub wr_id: Le64,
        /// `ibv_wc_status` ([`crate::verbs::WcStatus`]).
        pub status: Le32,
        /// `ibv_wc_opcode` ([`crate::verbs::WcOpcode`]).
        pub opcode: Le32,
        /// Vendor error.
        pub vendor_err: Le32,
        /// Bytes transferred.
        pub byte_len: Le32,
        /// `ex.imm_data` (network byte order) or `ex.invalidate_rkey`, as raw bytes.
        pub ex: [u8; 4],
        /// Local QPN (the host QPN, as in the CREATE_QP response).
        pub qp_num: Le32,
        /// Source QPN.
        pub src_qp: Le32,
        /// Kernel `ib_wc_flags`.
        pub wc_flags: Le32,
        /// P_Key index.
        pub pkey_index: Le16,
        /// Source LID.
        pub slid: Le16,
        /// Service level.
        pub sl: u8,
        /// DLID path bits.
        pub dlid_path_bits: u8,
        /// Port number.
        pub port_num: u8,
        /// Reserved.
        pub reserved: u8,
    }
}
assert_layout!(IbUverbsWc, 48, wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16,
    byte_len @ 20, ex @ 24, qp_num @ 28, src_qp @ 32, wc_flags @ 36, pkey_index @ 40,
    slid @ 42, sl @ 44, dlid_path_bits @ 45, port_num @ 46, reserved @ 47);

/// Bytes of one rxe CQ entry: `sizeof(struct rxe_cqe)`, the union of the kernel's `struct ib_wc`
/// (72 bytes on x86-64 since `port_num` became a u32 in Linux 5.13) and [`IbUverbsWc`]. The
/// kernel-only `ib_wc` is the larger member, so an entry is larger than the half a user reads;
/// the slot is this rounded up to a power of two.
pub const CQE_SIZE: usize = 72;
const _: () = assert!(CQE_SIZE >= size_of::<IbUverbsWc>());

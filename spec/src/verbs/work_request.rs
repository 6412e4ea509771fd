//! Send work requests: the opcodes vrdma carries, which QP types carry them, the send flags,
//! and memory-window types.

use super::qp::QpType;

verbs_enum! {
    /// Send work-request opcodes vrdma carries (`ibv_wr_opcode`), as written into
    /// `rxe_send_wr.opcode`. The other `ibv_wr_opcode` values (TSO, the driver-specific
    /// ones, …) are refused by `try_from`. LOCAL_INV, BIND_MW and SEND_WITH_INV need
    /// `VRDMA_F_MW` (spec §9.2).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub enum WrOpcode: u32 {
        /// RDMA write.
        RdmaWrite = 0,
        /// RDMA write with immediate data (consumes a receive at the target).
        RdmaWriteWithImm = 1,
        /// Send.
        #[default]
        Send = 2,
        /// Send with immediate data.
        SendWithImm = 3,
        /// RDMA read.
        RdmaRead = 4,
        /// 64-bit atomic compare and swap.
        AtomicCmpAndSwp = 5,
        /// 64-bit atomic fetch and add.
        AtomicFetchAndAdd = 6,
        /// Invalidate the rkey in `invalidate_rkey` (a type-2 memory window) locally.
        LocalInv = 7,
        /// Bind a memory window to a range of a memory region.
        BindMw = 8,
        /// Send that also invalidates `invalidate_rkey` on the responder.
        SendWithInv = 9,
        /// RDMA FLUSH (RC only): makes a remote range (or its whole MR) globally visible or
        /// persistent (rxe's `IB_WR_FLUSH`, Linux 6.2 and later). The MR needs the matching
        /// `FLUSH_*` access.
        Flush = 14,
        /// 8-byte atomic write (RC only): the 8 bytes in the WQE's payload area land at
        /// `remote_addr` in one piece (rxe's `IB_WR_ATOMIC_WRITE`; its kernel takes it since
        /// Linux 6.2).
        AtomicWrite = 15,
    }
}

verbs_enum! {
    /// Memory-window types (`ibv_mw_type`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub enum MwType: u32 {
        /// Type 1: bound with `ibv_bind_mw`, stays until unbound or freed; not invalidatable.
        #[default]
        Type1 = 1,
        /// Type 2 (rxe: 2B): bound by a BIND_MW work request to one QP, invalidated by
        /// LOCAL_INV or SEND_WITH_INV.
        Type2 = 2,
    }
}

impl WrOpcode {
    /// Whether the opcode carries immediate data.
    pub const fn has_imm(self) -> bool {
        matches!(self, WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm)
    }

    /// Whether the opcode addresses remote memory through `remote_addr`/`rkey`.
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead
        )
    }

    /// Whether the opcode is a remote atomic operation.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }

    /// Whether a QP of `qp_type` can carry the operation, as rdma_rxe's opcode table says: a
    /// UD QP only sends; a UC QP sends, writes and binds memory windows (no responses come
    /// back on UC, so no RDMA READ and no atomics; no UC wire opcode carries an invalidate,
    /// and rxe's LOCAL_INV is RC-only); an RC QP does everything.
    pub const fn valid_on(self, qp_type: QpType) -> bool {
        match qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                self,
                WrOpcode::Send
                    | WrOpcode::SendWithImm
                    | WrOpcode::RdmaWrite
                    | WrOpcode::RdmaWriteWithImm
                    | WrOpcode::BindMw
            ),
            QpType::Ud => matches!(self, WrOpcode::Send | WrOpcode::SendWithImm),
        }
    }

    /// Bytes the operation carries in the WQE itself, in place of SGEs or inline data:
    /// ATOMIC_WRITE's 8 (rxe's `dma.atomic_wr`).
    pub const fn wqe_operand_len(self) -> usize {
        match self {
            WrOpcode::AtomicWrite => 8,
            _ => 0,
        }
    }

    /// Whether the payload may be given inline (it flows from the local buffer to the wire).
    pub const fn allows_inline(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        )
    }

    /// Whether the opcode carries an rkey to invalidate in `rxe_send_wr.ex`.
    pub const fn has_invalidate(self) -> bool {
        matches!(self, WrOpcode::LocalInv | WrOpcode::SendWithInv)
    }

    /// Whether the opcode is a local memory operation: no payload, nothing on the wire.
    pub const fn is_local(self) -> bool {
        matches!(self, WrOpcode::LocalInv | WrOpcode::BindMw)
    }

    /// Whether the request's WQE may carry SGEs or inline bytes: local operations, FLUSH (a
    /// range, no data) and opcodes whose operand sits in the payload area carry none.
    pub const fn takes_sges(self) -> bool {
        !(self.is_local() || self.wqe_operand_len() != 0 || matches!(self, WrOpcode::Flush))
    }

    /// Whether the opcode uses memory windows, i.e. needs `VRDMA_F_MW`.
    pub const fn needs_memory_windows(self) -> bool {
        matches!(
            self,
            WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::SendWithInv
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every opcode, in `ibv_wr_opcode` order.
    const ALL: [WrOpcode; 12] = [
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::LocalInv,
        WrOpcode::BindMw,
        WrOpcode::SendWithInv,
        WrOpcode::Flush,
        WrOpcode::AtomicWrite,
    ];

    #[test]
    fn wr_opcodes_convert_both_ways_and_refuse_others() {
        for (raw, op) in ALL[..10].iter().copied().enumerate() {
            assert_eq!(op as u32, raw as u32);
            assert_eq!(WrOpcode::try_from(raw as u32), Ok(op));
        }
        assert_eq!(WrOpcode::try_from(14), Ok(WrOpcode::Flush));
        assert_eq!(WrOpcode::try_from(15), Ok(WrOpcode::AtomicWrite));
        // TSO and the driver-specific ones are not carried.
        for v in [10, 13, 200, u32::MAX] {
            assert_eq!(WrOpcode::try_from(v), Err(v));
        }
    }

    #[test]
    fn opcode_classes() {
        use WrOpcode::*;
        let inline: Vec<_> = ALL.iter().filter(|op| op.allows_inline()).collect();
        assert_eq!(
            inline,
            [
                &RdmaWrite,
                &RdmaWriteWithImm,
                &Send,
                &SendWithImm,
                &SendWithInv
            ]
        );
        let local: Vec<_> = ALL.iter().filter(|op| op.is_local()).collect();
        assert_eq!(local, [&LocalInv, &BindMw]);
        let inv: Vec<_> = ALL.iter().filter(|op| op.has_invalidate()).collect();
        assert_eq!(inv, [&LocalInv, &SendWithInv]);
        assert_eq!(MwType::try_from(1), Ok(MwType::Type1));
        assert_eq!(MwType::try_from(2), Ok(MwType::Type2));
        assert_eq!(MwType::try_from(0), Err(0));
        assert_eq!(MwType::try_from(3), Err(3));
        let imm: Vec<_> = ALL.iter().filter(|op| op.has_imm()).collect();
        assert_eq!(imm, [&RdmaWriteWithImm, &SendWithImm]);
        let rdma: Vec<_> = ALL.iter().filter(|op| op.is_rdma()).collect();
        assert_eq!(rdma, [&RdmaWrite, &RdmaWriteWithImm, &RdmaRead]);
        let atomic: Vec<_> = ALL.iter().filter(|op| op.is_atomic()).collect();
        assert_eq!(atomic, [&AtomicCmpAndSwp, &AtomicFetchAndAdd]);
        let operands: Vec<_> = ALL.iter().filter(|op| op.wqe_operand_len() != 0).collect();
        assert_eq!(operands, [&AtomicWrite]);
        assert_eq!(AtomicWrite.wqe_operand_len(), 8);
    }

    #[test]
    fn opcodes_valid_per_qp_type_as_in_rxe() {
        use WrOpcode::*;
        let on =
            |qp_type| -> Vec<_> { ALL.into_iter().filter(|op| op.valid_on(qp_type)).collect() };
        assert_eq!(on(QpType::Rc), ALL);
        assert_eq!(
            on(QpType::Uc),
            [RdmaWrite, RdmaWriteWithImm, Send, SendWithImm, BindMw]
        );
        assert_eq!(on(QpType::Ud), [Send, SendWithImm]);
        assert!(!AtomicWrite.valid_on(QpType::Uc), "RC only, as rxe");
        assert!(!Flush.valid_on(QpType::Uc), "RC only, as rxe");
    }
}

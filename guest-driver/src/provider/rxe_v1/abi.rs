//! The rxe structures shared with the host kernel, from `include/uapi/rdma/rdma_user_rxe.h`
//! and `ib_user_verbs.h` (x86-64 layout; identical in kernels 6.1 and 6.12 for everything here).
//!
//! Flexible arrays are not fields: the SGE array or inline data of a WQE starts right after the
//! fixed part (`size_of::<RxeSendWqe>()`, `size_of::<RxeRecvWqe>()`).

use std::mem::{offset_of, size_of};

/// Size of `struct rxe_av`, the address vector of a UD send.
pub const RXE_AV_SIZE: usize = 88;

/// `wqe->state` of a freshly posted send WQE (the kernel's `wqe_state_posted`).
pub const WQE_STATE_POSTED: u32 = 0;

/// `struct rxe_queue_buf` without its flexible `data` array: the queue header.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RxeQueueBuf {
    /// log2 of the slot size.
    pub log2_elem_size: u32,
    /// Number of slots minus one.
    pub index_mask: u32,
    /// Keeps the producer index in its own cache line.
    pub pad_1: [u32; 30],
    /// Producer index.
    pub producer_index: u32,
    /// Keeps the consumer index in its own cache line.
    pub pad_2: [u32; 31],
    /// Consumer index.
    pub consumer_index: u32,
    /// Pads the header to 384 bytes.
    pub pad_3: [u32; 31],
}

/// `struct rxe_sge`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RxeSge {
    /// Address in the MR's iova space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// MR local key.
    pub lkey: u32,
}

/// `struct rxe_dma_info` without its flexible SGE / inline-data array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct RxeDmaInfo {
    /// Total payload bytes.
    pub length: u32,
    /// Bytes left to transfer (posted as `length`).
    pub resid: u32,
    /// Current SGE (posted as 0).
    pub cur_sge: u32,
    /// Number of SGEs.
    pub num_sge: u32,
    /// Offset in the current SGE (posted as 0).
    pub sge_offset: u32,
    /// Zero.
    pub reserved: u32,
}

/// `rxe_send_wr.wr.rdma`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RxeRdmaWr {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Zero.
    pub reserved: u32,
}

/// `rxe_send_wr.wr.atomic`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RxeAtomicWr {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Swap operand.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
    /// Zero.
    pub reserved: u32,
}

/// `rxe_send_wr.wr.ud`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct RxeUdWr {
    /// Destination QPN.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Zero.
    pub reserved: u16,
    /// AH index from CREATE_AH (0: use `av`).
    pub ah_num: u32,
    /// Zero.
    pub pad: [u32; 4],
    /// `struct rxe_av`, only used by kernels that return `ah_num` 0.
    pub av: [u8; RXE_AV_SIZE],
}

/// The `wr` union of `struct rxe_send_wr`; which member is valid depends on the opcode.
#[derive(Clone, Copy)]
#[repr(C)]
pub union RxeSendWrUnion {
    /// RDMA read/write.
    pub rdma: RxeRdmaWr,
    /// Atomics.
    pub atomic: RxeAtomicWr,
    /// UD sends.
    pub ud: RxeUdWr,
    /// The whole union as plain words.
    pub raw: [u64; 15],
}

impl RxeSendWrUnion {
    /// All bytes zero, as rdma-core clears the request before filling it.
    pub const fn zeroed() -> Self {
        RxeSendWrUnion { raw: [0; 15] }
    }

    /// The union read as its `rdma` member.
    pub fn rdma(&self) -> RxeRdmaWr {
        // SAFETY: every member is plain integers covered by `raw`, so every bit pattern of the
        // union is a valid `RxeRdmaWr`.
        unsafe { self.rdma }
    }

    /// The union read as its `atomic` member.
    pub fn atomic(&self) -> RxeAtomicWr {
        // SAFETY: as in `rdma`: any bit pattern is a valid `RxeAtomicWr`.
        unsafe { self.atomic }
    }

    /// The union read as its `ud` member.
    pub fn ud(&self) -> RxeUdWr {
        // SAFETY: as in `rdma`: any bit pattern is a valid `RxeUdWr`.
        unsafe { self.ud }
    }

    /// The union as plain words.
    pub fn raw(&self) -> [u64; 15] {
        // SAFETY: as in `rdma`: any bit pattern is a valid `[u64; 15]`.
        unsafe { self.raw }
    }
}

/// `struct rxe_send_wr`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RxeSendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Zero (was `num_sge` before kernel 5.10; the kernel now uses `dma.num_sge`).
    pub reserved: u32,
    /// `ibv_wr_opcode`.
    pub opcode: u32,
    /// `ibv_send_flags`.
    pub send_flags: u32,
    /// `ex.imm_data` (network byte order) or `ex.invalidate_rkey`.
    pub ex: u32,
    /// Opcode-specific part.
    pub wr: RxeSendWrUnion,
}

/// `struct rxe_send_wqe` without its flexible array. Only `wr`, `state`, `iova` and `dma` are
/// written by this process; the others belong to the kernel once the WQE is posted.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RxeSendWqe {
    /// The request.
    pub wr: RxeSendWr,
    /// Kernel-owned.
    pub status: u32,
    /// Posted as [`WQE_STATE_POSTED`], then kernel-owned.
    pub state: u32,
    /// Remote address of RDMA and atomic operations.
    pub iova: u64,
    /// Kernel-owned.
    pub mask: u32,
    /// Kernel-owned.
    pub first_psn: u32,
    /// Kernel-owned.
    pub last_psn: u32,
    /// Kernel-owned.
    pub ack_length: u32,
    /// Kernel-owned.
    pub ssn: u32,
    /// Kernel-owned.
    pub has_rd_atomic: u32,
    /// Payload description; SGEs or inline bytes follow.
    pub dma: RxeDmaInfo,
}

/// `struct rxe_recv_wqe` without its flexible SGE array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RxeRecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Zero.
    pub reserved: u32,
    /// Zero.
    pub padding: u32,
    /// Buffer description; SGEs follow.
    pub dma: RxeDmaInfo,
}

/// `struct ib_uverbs_wc`: the user half of a CQ slot (same layout as `ibv_wc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct IbUverbsWc {
    /// `wr_id` of the completed request.
    pub wr_id: u64,
    /// `ibv_wc_status`.
    pub status: u32,
    /// `ibv_wc_opcode`.
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes transferred.
    pub byte_len: u32,
    /// `ex.imm_data` (network byte order) or `ex.invalidate_rkey`.
    pub ex: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Source QPN.
    pub src_qp: u32,
    /// Kernel `ib_wc_flags`.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Port number.
    pub port_num: u8,
    /// Reserved.
    pub reserved: u8,
}

/// Plain data exchanged with the kernel through a queue slot: built from integers only, with
/// no padding (every byte of a value is initialised, so its bytes can be copied out) and valid
/// for any bit pattern (so it can be read from bytes another party wrote), aligned to at most
/// 8 bytes.
///
/// # Safety
///
/// Implementors must be exactly that.
pub(super) unsafe trait Plain: Copy {}

// SAFETY (all impls below): integers and arrays of integers, aligned to at most 8. Each size
// asserted below equals the sum of the struct's field sizes, so none has padding. The
// union in `RxeSendWr` is covered entirely by its `raw` member, and each other member is
// itself padding-free, so every byte of it is initialised whichever member was written last.
// SAFETY: see above.
unsafe impl Plain for u32 {}
// SAFETY: see above.
unsafe impl Plain for u64 {}
// SAFETY: see above.
unsafe impl Plain for RxeSge {}
// SAFETY: see above.
unsafe impl Plain for RxeDmaInfo {}
// SAFETY: see above.
unsafe impl Plain for RxeSendWr {}
// SAFETY: see above.
unsafe impl Plain for RxeRecvWqe {}
// SAFETY: see above.
unsafe impl Plain for IbUverbsWc {}

// Layouts of kernel 6.1 and 6.12 (x86-64); the test below checks them against the C headers.
const _: () = {
    assert!(size_of::<RxeQueueBuf>() == 384);
    assert!(offset_of!(RxeQueueBuf, log2_elem_size) == 0);
    assert!(offset_of!(RxeQueueBuf, index_mask) == 4);
    assert!(offset_of!(RxeQueueBuf, producer_index) == 128);
    assert!(offset_of!(RxeQueueBuf, consumer_index) == 256);

    assert!(size_of::<RxeSge>() == 16);
    assert!(size_of::<RxeDmaInfo>() == 24);
    assert!(size_of::<RxeRdmaWr>() == 16);
    assert!(size_of::<RxeAtomicWr>() == 32);
    assert!(size_of::<RxeUdWr>() == 120);
    assert!(offset_of!(RxeUdWr, ah_num) == 12);
    assert!(offset_of!(RxeUdWr, av) == 32);
    assert!(size_of::<RxeSendWrUnion>() == 120);

    assert!(size_of::<RxeSendWr>() == 144);
    assert!(offset_of!(RxeSendWr, opcode) == 12);
    assert!(offset_of!(RxeSendWr, send_flags) == 16);
    assert!(offset_of!(RxeSendWr, ex) == 20);
    assert!(offset_of!(RxeSendWr, wr) == 24);

    assert!(size_of::<RxeSendWqe>() == 208);
    assert!(offset_of!(RxeSendWqe, status) == 144);
    assert!(offset_of!(RxeSendWqe, state) == 148);
    assert!(offset_of!(RxeSendWqe, iova) == 152);
    assert!(offset_of!(RxeSendWqe, mask) == 160);
    assert!(offset_of!(RxeSendWqe, has_rd_atomic) == 180);
    assert!(offset_of!(RxeSendWqe, dma) == 184);

    assert!(size_of::<RxeRecvWqe>() == 40);
    assert!(offset_of!(RxeRecvWqe, dma) == 16);

    assert!(size_of::<IbUverbsWc>() == 48);
    assert!(offset_of!(IbUverbsWc, ex) == 24);
    assert!(offset_of!(IbUverbsWc, wc_flags) == 36);
    assert!(offset_of!(IbUverbsWc, pkey_index) == 40);
    assert!(offset_of!(IbUverbsWc, port_num) == 46);
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::ErrorKind;
    use std::process::Command;
    use vrdma_spec::verbs::{WcOpcode, WrOpcode};

    /// One fact about the C headers, as a C expression and the value Rust says it has.
    struct Fact {
        c_expr: String,
        rust: usize,
    }

    fn size(c_type: &str, rust: usize) -> Fact {
        Fact {
            c_expr: format!("sizeof(struct {c_type})"),
            rust,
        }
    }

    fn offset(c_type: &str, c_field: &str, rust: usize) -> Fact {
        Fact {
            c_expr: format!("offsetof(struct {c_type}, {c_field})"),
            rust,
        }
    }

    fn value(c_name: &str, rust: u32) -> Fact {
        Fact {
            c_expr: c_name.to_string(),
            rust: rust as usize,
        }
    }

    fn facts() -> Vec<Fact> {
        let wr = offset_of!(RxeSendWqe, wr) + offset_of!(RxeSendWr, wr);
        let mut f = vec![
            size("rxe_queue_buf", size_of::<RxeQueueBuf>()),
            offset(
                "rxe_queue_buf",
                "log2_elem_size",
                offset_of!(RxeQueueBuf, log2_elem_size),
            ),
            offset(
                "rxe_queue_buf",
                "index_mask",
                offset_of!(RxeQueueBuf, index_mask),
            ),
            offset(
                "rxe_queue_buf",
                "producer_index",
                offset_of!(RxeQueueBuf, producer_index),
            ),
            offset(
                "rxe_queue_buf",
                "consumer_index",
                offset_of!(RxeQueueBuf, consumer_index),
            ),
            offset("rxe_queue_buf", "data", size_of::<RxeQueueBuf>()),
            size("rxe_sge", size_of::<RxeSge>()),
            offset("rxe_sge", "addr", offset_of!(RxeSge, addr)),
            offset("rxe_sge", "length", offset_of!(RxeSge, length)),
            offset("rxe_sge", "lkey", offset_of!(RxeSge, lkey)),
            size("rxe_dma_info", size_of::<RxeDmaInfo>()),
            offset("rxe_dma_info", "length", offset_of!(RxeDmaInfo, length)),
            offset("rxe_dma_info", "resid", offset_of!(RxeDmaInfo, resid)),
            offset("rxe_dma_info", "cur_sge", offset_of!(RxeDmaInfo, cur_sge)),
            offset("rxe_dma_info", "num_sge", offset_of!(RxeDmaInfo, num_sge)),
            offset(
                "rxe_dma_info",
                "sge_offset",
                offset_of!(RxeDmaInfo, sge_offset),
            ),
            offset("rxe_dma_info", "reserved", offset_of!(RxeDmaInfo, reserved)),
            offset("rxe_dma_info", "sge", size_of::<RxeDmaInfo>()),
            offset("rxe_dma_info", "inline_data", size_of::<RxeDmaInfo>()),
            size("rxe_av", RXE_AV_SIZE),
            size("rxe_send_wr", size_of::<RxeSendWr>()),
            offset("rxe_send_wr", "wr_id", offset_of!(RxeSendWr, wr_id)),
            offset("rxe_send_wr", "reserved", offset_of!(RxeSendWr, reserved)),
            offset("rxe_send_wr", "opcode", offset_of!(RxeSendWr, opcode)),
            offset(
                "rxe_send_wr",
                "send_flags",
                offset_of!(RxeSendWr, send_flags),
            ),
            offset("rxe_send_wr", "ex.imm_data", offset_of!(RxeSendWr, ex)),
            offset(
                "rxe_send_wr",
                "ex.invalidate_rkey",
                offset_of!(RxeSendWr, ex),
            ),
            offset("rxe_send_wr", "wr", offset_of!(RxeSendWr, wr)),
            size("rxe_send_wqe", size_of::<RxeSendWqe>()),
            offset("rxe_send_wqe", "wr", offset_of!(RxeSendWqe, wr)),
            offset("rxe_send_wqe", "status", offset_of!(RxeSendWqe, status)),
            offset("rxe_send_wqe", "state", offset_of!(RxeSendWqe, state)),
            offset("rxe_send_wqe", "iova", offset_of!(RxeSendWqe, iova)),
            offset("rxe_send_wqe", "mask", offset_of!(RxeSendWqe, mask)),
            offset(
                "rxe_send_wqe",
                "first_psn",
                offset_of!(RxeSendWqe, first_psn),
            ),
            offset("rxe_send_wqe", "last_psn", offset_of!(RxeSendWqe, last_psn)),
            offset(
                "rxe_send_wqe",
                "ack_length",
                offset_of!(RxeSendWqe, ack_length),
            ),
            offset("rxe_send_wqe", "ssn", offset_of!(RxeSendWqe, ssn)),
            offset(
                "rxe_send_wqe",
                "has_rd_atomic",
                offset_of!(RxeSendWqe, has_rd_atomic),
            ),
            offset("rxe_send_wqe", "dma", offset_of!(RxeSendWqe, dma)),
            offset("rxe_send_wqe", "dma.sge", size_of::<RxeSendWqe>()),
            offset("rxe_send_wqe", "dma.inline_data", size_of::<RxeSendWqe>()),
            offset(
                "rxe_send_wqe",
                "wr.wr.rdma.remote_addr",
                wr + offset_of!(RxeRdmaWr, remote_addr),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.rdma.rkey",
                wr + offset_of!(RxeRdmaWr, rkey),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.atomic.remote_addr",
                wr + offset_of!(RxeAtomicWr, remote_addr),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.atomic.compare_add",
                wr + offset_of!(RxeAtomicWr, compare_add),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.atomic.swap",
                wr + offset_of!(RxeAtomicWr, swap),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.atomic.rkey",
                wr + offset_of!(RxeAtomicWr, rkey),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.ud.remote_qpn",
                wr + offset_of!(RxeUdWr, remote_qpn),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.ud.remote_qkey",
                wr + offset_of!(RxeUdWr, remote_qkey),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.ud.pkey_index",
                wr + offset_of!(RxeUdWr, pkey_index),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.ud.ah_num",
                wr + offset_of!(RxeUdWr, ah_num),
            ),
            offset(
                "rxe_send_wqe",
                "wr.wr.ud.pad",
                wr + offset_of!(RxeUdWr, pad),
            ),
            offset("rxe_send_wqe", "wr.wr.ud.av", wr + offset_of!(RxeUdWr, av)),
            size("rxe_recv_wqe", size_of::<RxeRecvWqe>()),
            offset("rxe_recv_wqe", "wr_id", offset_of!(RxeRecvWqe, wr_id)),
            offset("rxe_recv_wqe", "reserved", offset_of!(RxeRecvWqe, reserved)),
            offset("rxe_recv_wqe", "padding", offset_of!(RxeRecvWqe, padding)),
            offset("rxe_recv_wqe", "dma", offset_of!(RxeRecvWqe, dma)),
            offset("rxe_recv_wqe", "dma.sge", size_of::<RxeRecvWqe>()),
            size("ib_uverbs_wc", size_of::<IbUverbsWc>()),
            offset("ib_uverbs_wc", "wr_id", offset_of!(IbUverbsWc, wr_id)),
            offset("ib_uverbs_wc", "status", offset_of!(IbUverbsWc, status)),
            offset("ib_uverbs_wc", "opcode", offset_of!(IbUverbsWc, opcode)),
            offset(
                "ib_uverbs_wc",
                "vendor_err",
                offset_of!(IbUverbsWc, vendor_err),
            ),
            offset("ib_uverbs_wc", "byte_len", offset_of!(IbUverbsWc, byte_len)),
            offset("ib_uverbs_wc", "ex.imm_data", offset_of!(IbUverbsWc, ex)),
            offset("ib_uverbs_wc", "qp_num", offset_of!(IbUverbsWc, qp_num)),
            offset("ib_uverbs_wc", "src_qp", offset_of!(IbUverbsWc, src_qp)),
            offset("ib_uverbs_wc", "wc_flags", offset_of!(IbUverbsWc, wc_flags)),
            offset(
                "ib_uverbs_wc",
                "pkey_index",
                offset_of!(IbUverbsWc, pkey_index),
            ),
            offset("ib_uverbs_wc", "slid", offset_of!(IbUverbsWc, slid)),
            offset("ib_uverbs_wc", "sl", offset_of!(IbUverbsWc, sl)),
            offset(
                "ib_uverbs_wc",
                "dlid_path_bits",
                offset_of!(IbUverbsWc, dlid_path_bits),
            ),
            offset("ib_uverbs_wc", "port_num", offset_of!(IbUverbsWc, port_num)),
            offset("ib_uverbs_wc", "reserved", offset_of!(IbUverbsWc, reserved)),
        ];
        let wr_opcodes = [
            ("IB_UVERBS_WR_RDMA_WRITE", WrOpcode::RdmaWrite),
            (
                "IB_UVERBS_WR_RDMA_WRITE_WITH_IMM",
                WrOpcode::RdmaWriteWithImm,
            ),
            ("IB_UVERBS_WR_SEND", WrOpcode::Send),
            ("IB_UVERBS_WR_SEND_WITH_IMM", WrOpcode::SendWithImm),
            ("IB_UVERBS_WR_RDMA_READ", WrOpcode::RdmaRead),
            ("IB_UVERBS_WR_ATOMIC_CMP_AND_SWP", WrOpcode::AtomicCmpAndSwp),
            (
                "IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD",
                WrOpcode::AtomicFetchAndAdd,
            ),
        ];
        f.extend(wr_opcodes.iter().map(|(c, op)| value(c, *op as u32)));
        // The 6.1 uapi names completion opcodes up to TSO; FLUSH (8) and ATOMIC_WRITE (9)
        // arrived in 6.2 and are checked against rdma-core's values in `provider` tests.
        let wc_opcodes = [
            ("IB_UVERBS_WC_SEND", WcOpcode::Send),
            ("IB_UVERBS_WC_RDMA_WRITE", WcOpcode::RdmaWrite),
            ("IB_UVERBS_WC_RDMA_READ", WcOpcode::RdmaRead),
            ("IB_UVERBS_WC_COMP_SWAP", WcOpcode::CompSwap),
            ("IB_UVERBS_WC_FETCH_ADD", WcOpcode::FetchAdd),
            ("IB_UVERBS_WC_BIND_MW", WcOpcode::BindMw),
            ("IB_UVERBS_WC_LOCAL_INV", WcOpcode::LocalInv),
            ("IB_UVERBS_WC_TSO", WcOpcode::Tso),
        ];
        f.extend(wc_opcodes.iter().map(|(c, op)| value(c, op.raw())));
        f
    }

    fn c_program(facts: &[Fact]) -> String {
        let mut src = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/ib_user_verbs.h>\n\
             #include <rdma/rdma_user_rxe.h>\nint main(void)\n{\n",
        );
        for (i, fact) in facts.iter().enumerate() {
            src.push_str(&format!(
                "\tprintf(\"{i} %lu\\n\", (unsigned long)({}));\n",
                fact.c_expr
            ));
        }
        src.push_str("\treturn 0;\n}\n");
        src
    }

    /// Compiles a C program against the system's uapi headers and compares every size, offset
    /// and constant it prints with the Rust definitions.
    #[test]
    fn layouts_match_system_uapi_headers() {
        match Command::new("cc").arg("--version").output() {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                eprintln!("skipped: no C compiler `cc` on PATH to check the uapi headers with");
                return;
            }
            Err(e) => panic!("running cc: {e}"),
            Ok(_) => {}
        }
        let facts = facts();
        let dir = std::env::temp_dir().join(format!("vrdma-rxe-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let bin = dir.join("layout");
        std::fs::write(&src, c_program(&facts)).unwrap();
        let cc = Command::new("cc")
            .arg("-Wall")
            .arg("-o")
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap();
        let run = cc
            .status
            .success()
            .then(|| Command::new(&bin).output().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            cc.status.success(),
            "cc failed:\n{}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let run = run.unwrap();
        assert!(run.status.success());
        let printed: BTreeMap<usize, usize> = String::from_utf8(run.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let (i, v) = line.split_once(' ').unwrap();
                (i.parse().unwrap(), v.parse().unwrap())
            })
            .collect();
        assert_eq!(printed.len(), facts.len());
        let wrong: Vec<String> = facts
            .iter()
            .enumerate()
            .filter(|(i, fact)| printed[i] != fact.rust)
            .map(|(i, fact)| format!("{}: C {} Rust {}", fact.c_expr, printed[&i], fact.rust))
            .collect();
        assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
    }
}

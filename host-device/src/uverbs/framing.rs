//! The framing of one legacy uverbs write command: the command numbers, the [`Command`] traits
//! every request struct implements, [`frame`] and `struct ib_uverbs_cmd_hdr`, and the macros
//! that declare an ABI struct and pin its layout.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Asserts at compile time the size of an ABI struct and the offsets of its fields.
macro_rules! abi_layout {
    ($ty:ty, $size:expr $(, $field:ident @ $off:expr)* $(,)?) => {
        const _: () = {
            assert!(::core::mem::size_of::<$ty>() == $size);
            $(assert!(::core::mem::offset_of!($ty, $field) == $off);)*
        };
    };
}
pub(crate) use abi_layout;

/// Declares a uverbs/rxe/ucma ABI struct: `#[repr(C)]` plain data that zerocopy can read from
/// and write to the kernel's buffers (padding must be explicit: `IntoBytes` refuses implicit
/// padding at compile time). With a leading `no_default:` it derives no `Default` (arrays of
/// more than 32 bytes have none; zero values come from `FromZeros`).
macro_rules! abi_struct {
    (no_default: $(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            ::zerocopy::FromBytes,
            ::zerocopy::IntoBytes,
            ::zerocopy::Immutable,
            ::zerocopy::KnownLayout,
        )]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }
    };
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty),* $(,)? }) => {
        $crate::uverbs::abi_struct!(no_default: $(#[$meta])* #[derive(Default)] pub struct $name { $($(#[$fmeta])* pub $field: $ty),* });
    };
}
pub(crate) use abi_struct;

/// `IB_USER_VERBS_ABI_VERSION`.
pub const ABI_VERSION: u32 = 6;

/// Legacy write command numbers (`enum ib_uverbs_write_cmds`).
pub mod cmd {
    /// `IB_USER_VERBS_CMD_GET_CONTEXT`.
    pub const GET_CONTEXT: u32 = 0;
    /// `IB_USER_VERBS_CMD_QUERY_DEVICE`.
    pub const QUERY_DEVICE: u32 = 1;
    /// `IB_USER_VERBS_CMD_QUERY_PORT`.
    pub const QUERY_PORT: u32 = 2;
    /// `IB_USER_VERBS_CMD_ALLOC_PD`.
    pub const ALLOC_PD: u32 = 3;
    /// `IB_USER_VERBS_CMD_DEALLOC_PD`.
    pub const DEALLOC_PD: u32 = 4;
    /// `IB_USER_VERBS_CMD_CREATE_AH`.
    pub const CREATE_AH: u32 = 5;
    /// `IB_USER_VERBS_CMD_DESTROY_AH`.
    pub const DESTROY_AH: u32 = 8;
    /// `IB_USER_VERBS_CMD_REG_MR`.
    pub const REG_MR: u32 = 9;
    /// `IB_USER_VERBS_CMD_REREG_MR`.
    pub const REREG_MR: u32 = 11;
    /// `IB_USER_VERBS_CMD_DEREG_MR`.
    pub const DEREG_MR: u32 = 13;
    /// `IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL`.
    pub const CREATE_COMP_CHANNEL: u32 = 17;
    /// `IB_USER_VERBS_CMD_CREATE_CQ`.
    pub const CREATE_CQ: u32 = 18;
    /// `IB_USER_VERBS_CMD_RESIZE_CQ`.
    pub const RESIZE_CQ: u32 = 19;
    /// `IB_USER_VERBS_CMD_DESTROY_CQ`.
    pub const DESTROY_CQ: u32 = 20;
    /// `IB_USER_VERBS_CMD_REQ_NOTIFY_CQ`.
    pub const REQ_NOTIFY_CQ: u32 = 23;
    /// `IB_USER_VERBS_CMD_CREATE_QP`.
    pub const CREATE_QP: u32 = 24;
    /// `IB_USER_VERBS_CMD_QUERY_QP`.
    pub const QUERY_QP: u32 = 25;
    /// `IB_USER_VERBS_CMD_MODIFY_QP`.
    pub const MODIFY_QP: u32 = 26;
    /// `IB_USER_VERBS_CMD_DESTROY_QP`.
    pub const DESTROY_QP: u32 = 27;
    /// `IB_USER_VERBS_CMD_POST_SEND`.
    pub const POST_SEND: u32 = vrdma_spec::rxe_v1::kick::CMD_POST_SEND;
    /// `IB_USER_VERBS_CMD_ALLOC_MW`.
    pub const ALLOC_MW: u32 = 14;
    /// `IB_USER_VERBS_CMD_DEALLOC_MW`.
    pub const DEALLOC_MW: u32 = 16;
    /// `IB_USER_VERBS_CMD_CREATE_SRQ`.
    pub const CREATE_SRQ: u32 = 32;
    /// `IB_USER_VERBS_CMD_MODIFY_SRQ`.
    pub const MODIFY_SRQ: u32 = 33;
    /// `IB_USER_VERBS_CMD_DESTROY_SRQ`.
    pub const DESTROY_SRQ: u32 = 35;
}

/// A legacy write command: its number, its name for errors, its core request layout.
pub trait Command: IntoBytes + Immutable {
    /// Command number (`IB_USER_VERBS_CMD_*`).
    const CODE: u32;
    /// Name used in errors and logs.
    const NAME: &'static str;
}

/// A command whose core request starts with `__aligned_u64 response`.
pub trait CommandWithResponse: Command {
    /// The core response (`struct ib_uverbs_*_resp` without its flexible `driver_data`).
    type Response: FromBytes + IntoBytes + Immutable + KnownLayout;
    /// Stores the user address of the response buffer into the request.
    fn set_response(&mut self, address: u64);
}

/// Implements [`Command`] (and [`CommandWithResponse`] when a response type is given) for a
/// request struct.
macro_rules! command {
    ($req:ty, $code:expr, $name:literal) => {
        impl Command for $req {
            const CODE: u32 = $code;
            const NAME: &'static str = $name;
        }
    };
    ($req:ty, $code:expr, $name:literal, $resp:ty) => {
        command!($req, $code, $name);
        impl CommandWithResponse for $req {
            type Response = $resp;
            fn set_response(&mut self, address: u64) {
                self.response = address;
            }
        }
    };
}
pub(super) use command;

/// Why a command buffer could not be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A length is not a multiple of 4 bytes.
    #[error("{what} length {len} is not a multiple of 4 bytes")]
    Unaligned {
        /// Which part.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A length does not fit the header's 16-bit word count.
    #[error("{what} length {len} exceeds the 16-bit word count of the command header")]
    TooLong {
        /// Which part.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
}

fn words(what: &'static str, len: usize) -> Result<u16, FrameError> {
    if !len.is_multiple_of(4) {
        return Err(FrameError::Unaligned { what, len });
    }
    u16::try_from(len / 4).map_err(|_| FrameError::TooLong { what, len })
}

/// Builds the `write()` buffer of a legacy command: header, core request, driver request.
/// `out_len` is the size of the response buffer (core + driver response) the request points at.
pub fn frame(
    code: u32,
    core: &[u8],
    driver_in: &[u8],
    out_len: usize,
) -> Result<Vec<u8>, FrameError> {
    let total = size_of::<CmdHdr>() + core.len() + driver_in.len();
    let hdr = CmdHdr {
        command: code,
        in_words: words("command", total)?,
        out_words: words("response", out_len)?,
    };
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(core);
    buf.extend_from_slice(driver_in);
    Ok(buf)
}

/// `IB_USER_VERBS_CMD_FLAG_EXTENDED`: the command is an extended one (`IB_USER_VERBS_EX_CMD_*`).
pub const CMD_FLAG_EXTENDED: u32 = 0x8000_0000;

/// Builds the `write()` buffer of an extended command `code` (`IB_USER_VERBS_EX_CMD_*`): the
/// header (its word counts in 8-byte words), the extended header naming the `out_len`-byte
/// response buffer at `response`, and the core request; no driver part.
pub fn frame_ex(
    code: u32,
    core: &[u8],
    response: u64,
    out_len: usize,
) -> Result<Vec<u8>, FrameError> {
    let words8 = |what, len: usize| {
        if !len.is_multiple_of(8) {
            return Err(FrameError::Unaligned { what, len });
        }
        u16::try_from(len / 8).map_err(|_| FrameError::TooLong { what, len })
    };
    let hdr = CmdHdr {
        command: CMD_FLAG_EXTENDED | code,
        in_words: words8("command", core.len())?,
        out_words: words8("response", out_len)?,
    };
    let ex_hdr = ExCmdHdr {
        response,
        ..ExCmdHdr::default()
    };
    let mut buf = Vec::with_capacity(size_of::<CmdHdr>() + size_of::<ExCmdHdr>() + core.len());
    buf.extend_from_slice(hdr.as_bytes());
    buf.extend_from_slice(ex_hdr.as_bytes());
    buf.extend_from_slice(core);
    Ok(buf)
}

abi_struct! {
    /// `struct ib_uverbs_ex_cmd_hdr`.
    pub struct ExCmdHdr {
        pub response: u64,
        pub provider_in_words: u16,
        pub provider_out_words: u16,
        pub cmd_hdr_reserved: u32,
    }
}
abi_layout!(ExCmdHdr, 16, response @ 0, provider_in_words @ 8, provider_out_words @ 10,
    cmd_hdr_reserved @ 12);

abi_struct! {
    /// `struct ib_uverbs_cmd_hdr`.
    pub struct CmdHdr {
        pub command: u32,
        pub in_words: u16,
        pub out_words: u16,
    }
}
abi_layout!(CmdHdr, 8, command @ 0, in_words @ 4, out_words @ 6);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uverbs::{
        CreateCq, KickCall, ModifyQp, ModifySrq, PostSend, PostSendResp, KICK_WQE_SIZE,
    };

    fn u32_at(buf: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(buf[off..off + 4].try_into().unwrap())
    }

    fn u64_at(buf: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(buf[off..off + 8].try_into().unwrap())
    }

    /// An extended command counts its words in 8 bytes and names its response in the
    /// extended header.
    #[test]
    fn an_extended_command_has_both_headers_and_eight_byte_words() {
        let buf = frame_ex(cmd::QUERY_DEVICE, &[0xaa; 8], 0x1000, 1024).unwrap();
        assert_eq!(buf.len(), 8 + 16 + 8);
        assert_eq!(u32_at(&buf, 0), 0x8000_0001);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 1);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 128);
        assert_eq!(u64_at(&buf, 8), 0x1000);
        assert_eq!(&buf[16..24], &[0; 8], "no provider words, reserved zero");
        assert_eq!(&buf[24..], &[0xaa; 8]);
        assert_eq!(
            frame_ex(cmd::QUERY_DEVICE, &[0; 4], 0, 8),
            Err(FrameError::Unaligned {
                what: "command",
                len: 4
            })
        );
    }

    #[test]
    fn kick_is_post_send_with_no_work_requests() {
        let req = PostSend {
            response: 0x1122_3344_5566_7788,
            qp_handle: 7,
            wr_count: 0,
            sge_count: 0,
            wqe_size: KICK_WQE_SIZE,
        };
        let buf = frame(
            PostSend::CODE,
            req.as_bytes(),
            &[],
            size_of::<PostSendResp>(),
        )
        .unwrap();
        // Same 32 bytes rdma-core's providers/rxe post_send_db() writes.
        assert_eq!(buf.len(), 32);
        assert_eq!(u32_at(&buf, 0), 28, "command");
        assert_eq!(
            u16::from_le_bytes([buf[4], buf[5]]),
            8,
            "in_words counts the header"
        );
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 1, "out_words");
        assert_eq!(u64_at(&buf, 8), 0x1122_3344_5566_7788, "response");
        assert_eq!(u32_at(&buf, 16), 7, "qp_handle");
        assert_eq!(u32_at(&buf, 20), 0, "wr_count");
        assert_eq!(u32_at(&buf, 24), 0, "sge_count");
        assert_eq!(u32_at(&buf, 28), 128, "wqe_size");
    }

    #[test]
    fn the_ioctl_kick_carries_the_write_kicks_request() {
        let mut kick = KickCall::new(7);
        kick.aim();
        let req = PostSend {
            qp_handle: 7,
            wqe_size: KICK_WQE_SIZE,
            ..PostSend::default()
        };
        let framed = frame(PostSend::CODE, req.as_bytes(), &[], 4).unwrap();
        // The write form's request after its header is the ioctl's CORE_IN; the command
        // number travels as WRITE_CMD.
        assert_eq!(kick.request.as_bytes(), &framed[8..]);
        assert_eq!(kick.attrs[0].data, u64::from(PostSend::CODE));
    }

    #[test]
    fn create_cq_response_covers_core_and_driver_parts() {
        let req = CreateCq {
            response: 0xdead_beef_0000,
            user_handle: 0x55,
            cqe: 63,
            comp_vector: 0,
            comp_channel: -1,
            reserved: 0,
        };
        // Core response 8 bytes + rxe_create_cq_resp 16 bytes.
        let buf = frame(CreateCq::CODE, req.as_bytes(), &[], 24).unwrap();
        assert_eq!(buf.len(), 40);
        assert_eq!(u32_at(&buf, 0), 18);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 10);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 6);
        assert_eq!(u64_at(&buf, 8), 0xdead_beef_0000);
        assert_eq!(u64_at(&buf, 16), 0x55, "user_handle");
        assert_eq!(u32_at(&buf, 24), 63, "cqe");
        assert_eq!(u32_at(&buf, 28), 0, "comp_vector");
        assert_eq!(u32_at(&buf, 32), u32::MAX, "comp_channel -1");
    }

    #[test]
    fn modify_srq_appends_driver_request_after_core() {
        let req = ModifySrq {
            srq_handle: 3,
            attr_mask: 2,
            max_wr: 0,
            srq_limit: 10,
        };
        let driver = 0x7fff_0000_1000u64.to_le_bytes();
        let buf = frame(ModifySrq::CODE, req.as_bytes(), &driver, 0).unwrap();
        assert_eq!(buf.len(), 8 + 16 + 8);
        assert_eq!(u32_at(&buf, 0), 33);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 8);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), 0);
        assert_eq!(u32_at(&buf, 8), 3);
        assert_eq!(u32_at(&buf, 12), 2);
        assert_eq!(u32_at(&buf, 20), 10);
        assert_eq!(
            u64_at(&buf, 24),
            0x7fff_0000_1000,
            "rxe_modify_srq_cmd.mmap_info_addr"
        );
    }

    #[test]
    fn modify_qp_fields_land_where_the_kernel_reads_them() {
        let mut req = ModifyQp {
            qp_handle: 9,
            attr_mask: 0x1 | 0x80,
            qp_state: 3,
            ..Default::default()
        };
        req.dest.dgid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        req.dest.is_global = 1;
        req.dest.port_num = 1;
        req.dest.hop_limit = 64;
        let buf = frame(ModifyQp::CODE, req.as_bytes(), &[], 0).unwrap();
        assert_eq!(buf.len(), 120);
        assert_eq!(u32_at(&buf, 0), 26);
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), 30);
        assert_eq!(&buf[8..10], &[0xfe, 0x80], "dest.dgid");
        assert_eq!(buf[8 + 25], 64, "dest.hop_limit");
        assert_eq!(buf[8 + 30], 1, "dest.is_global");
        assert_eq!(buf[8 + 31], 1, "dest.port_num");
        assert_eq!(u32_at(&buf, 8 + 64), 9, "qp_handle");
        assert_eq!(u32_at(&buf, 8 + 68), 0x81, "attr_mask");
        assert_eq!(buf[8 + 96], 3, "qp_state");
    }

    #[test]
    fn framing_rejects_lengths_the_header_cannot_express() {
        assert_eq!(
            frame(0, &[0; 6], &[], 0),
            Err(FrameError::Unaligned {
                what: "command",
                len: 14
            })
        );
        assert_eq!(
            frame(0, &[], &[], 6),
            Err(FrameError::Unaligned {
                what: "response",
                len: 6
            })
        );
        assert!(matches!(
            frame(0, &vec![0; 4 * 70000], &[], 0),
            Err(FrameError::TooLong { .. })
        ));
    }
}

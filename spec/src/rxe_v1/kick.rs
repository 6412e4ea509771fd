//! rxe's doorbell: the system call that starts the host kernel's send processing of a QP whose
//! send queue has new WQEs (spec §5.3, §9.2), and the uverbs `ioctl()` framing it travels in.
//!
//! rdma_rxe reads its queues from shared memory but starts a user QP's requester only when the
//! QP's owner issues POST_SEND with no work request (rdma-core's `post_send_db()`). The device
//! does that on the driver's doorbell. A driver whose front-end holds the host verbs context
//! (`VRDMA_F_HOST_KICK`, spec §5.3) issues it itself, as a [`KickCall`]: the same empty
//! POST_SEND through `RDMA_VERBS_IOCTL`'s `UVERBS_METHOD_INVOKE_WRITE`, the one form the kernel
//! accepts on a file another process opened (`write()` checks the opener's credentials,
//! `ib_safe_file_access`; the ioctl does not). The device kicks with the same call, so one
//! definition serves both; [`IoctlHdr`] and [`IoctlAttr`] also frame the device's other uverbs
//! ioctls. All of it is the kernel's ABI (`rdma_user_ioctl_cmds.h`, `ib_user_ioctl_cmds.h`,
//! `ib_user_verbs.h`), native-endian like every rxe v1 structure. The method exists since
//! Linux 5.0; rxe v1 needs 5.16 anyway.

use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`, in the generic `_IOC`
/// layout of x86, arm64 and riscv (powerpc, mips and sparc encode it otherwise).
pub const RDMA_VERBS_IOCTL: u64 =
    (3 << 30) | ((size_of::<IoctlHdr>() as u64) << 16) | (0x1b << 8) | 1;

/// `RDMA_DRIVER_RXE` (`enum rdma_driver_id`): the kernel refuses a call whose header names
/// another driver than the device's (EINVAL).
pub const DRIVER_RXE: u32 = 14;

/// `UVERBS_OBJECT_DEVICE`.
pub const OBJECT_DEVICE: u16 = 0;
/// `UVERBS_METHOD_INVOKE_WRITE`: runs a write-style command from its attributes.
pub const METHOD_INVOKE_WRITE: u16 = 0;

/// `enum uverbs_attrs_invoke_write_cmd_attr_ids`.
pub mod invoke_write_attr {
    /// `UVERBS_ATTR_CORE_IN`: the command's request, without `struct ib_uverbs_cmd_hdr`.
    pub const CORE_IN: u16 = 0;
    /// `UVERBS_ATTR_CORE_OUT`: the command's response.
    pub const CORE_OUT: u16 = 1;
    /// `UVERBS_ATTR_WRITE_CMD`: the write command number (a "const" attribute: 8 bytes inline).
    pub const WRITE_CMD: u16 = 2;
}

/// `IB_USER_VERBS_CMD_POST_SEND`.
pub const CMD_POST_SEND: u32 = 28;

/// `wqe_size` of the kick: `sizeof(struct ibv_send_wr)` as rdma-core's rxe provider sends it.
/// The kernel rejects a `wqe_size` below `sizeof(struct ib_uverbs_send_wr)` even when no work
/// request follows.
pub const KICK_WQE_SIZE: u32 = 128;

/// `UVERBS_ATTR_F_MANDATORY`.
pub const ATTR_F_MANDATORY: u16 = 1;

/// `struct ib_uverbs_ioctl_hdr` (the attributes follow it).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct IoctlHdr {
    /// Bytes of the header and the attributes.
    pub length: u16,
    /// The object whose method is called.
    pub object_id: u16,
    /// The method.
    pub method_id: u16,
    /// Attributes following the header.
    pub num_attrs: u16,
    /// Zero.
    pub reserved1: u64,
    /// The device's driver ([`DRIVER_RXE`]).
    pub driver_id: u32,
    /// Zero.
    pub reserved2: u32,
}

/// `struct ib_uverbs_attr`: `data` is the value itself (inline, up to 8 bytes) or a user
/// address.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct IoctlAttr {
    /// Which attribute of the method.
    pub attr_id: u16,
    /// Bytes of the value.
    pub len: u16,
    /// `UVERBS_ATTR_F_*`; the kernel sets `VALID_OUTPUT` on outputs it wrote.
    pub flags: u16,
    /// Zero for the attributes used here.
    pub attr_data: u16,
    /// The value (up to 8 bytes) or the buffer's address.
    pub data: u64,
}

impl IoctlAttr {
    /// A mandatory inline input of `len` bytes.
    pub fn inline(attr_id: u16, len: u16, value: u64) -> IoctlAttr {
        IoctlAttr {
            attr_id,
            len,
            flags: ATTR_F_MANDATORY,
            attr_data: 0,
            data: value,
        }
    }

    /// A mandatory buffer at `address` of `len` bytes (an input longer than 8 bytes, or an
    /// output).
    pub fn buffer(attr_id: u16, address: u64, len: u16) -> IoctlAttr {
        IoctlAttr {
            attr_id,
            len,
            flags: ATTR_F_MANDATORY,
            attr_data: 0,
            data: address,
        }
    }
}

/// `struct ib_uverbs_post_send` with no work requests attached.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct PostSend {
    /// The response's address (write form only).
    pub response: u64,
    /// The QP, by its handle in the verbs context.
    pub qp_handle: u32,
    /// Work requests following (none in a kick).
    pub wr_count: u32,
    /// SGEs following (none in a kick).
    pub sge_count: u32,
    /// Bytes per work request ([`KICK_WQE_SIZE`]).
    pub wqe_size: u32,
}

/// `struct ib_uverbs_post_send_resp`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct PostSendResp {
    /// Index of the first work request that failed.
    pub bad_wr: u32,
}

/// One kick, complete and self-contained: the header, its three attributes, the POST_SEND
/// request they point at and the response the kernel writes. Built on the caller's stack, no
/// allocation; [`KickCall::aim`] points the attributes at the call's own fields where it lies.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoBytes, Immutable)]
pub struct KickCall {
    /// The call's header.
    pub hdr: IoctlHdr,
    /// WRITE_CMD, CORE_IN, CORE_OUT.
    pub attrs: [IoctlAttr; 3],
    /// What CORE_IN points at.
    pub request: PostSend,
    /// What CORE_OUT points at.
    pub response: PostSendResp,
    /// Keeps the struct a multiple of 8 bytes with no implicit padding.
    pub reserved: u32,
}

impl KickCall {
    /// The kick of the QP `qp_handle` names in its host verbs context, not yet aimed.
    pub fn new(qp_handle: u32) -> KickCall {
        KickCall {
            hdr: IoctlHdr {
                length: (size_of::<IoctlHdr>() + 3 * size_of::<IoctlAttr>()) as u16,
                object_id: OBJECT_DEVICE,
                method_id: METHOD_INVOKE_WRITE,
                num_attrs: 3,
                driver_id: DRIVER_RXE,
                ..IoctlHdr::default()
            },
            attrs: [
                IoctlAttr::inline(invoke_write_attr::WRITE_CMD, 8, CMD_POST_SEND.into()),
                IoctlAttr::buffer(invoke_write_attr::CORE_IN, 0, size_of::<PostSend>() as u16),
                IoctlAttr::buffer(
                    invoke_write_attr::CORE_OUT,
                    0,
                    size_of::<PostSendResp>() as u16,
                ),
            ],
            request: PostSend {
                // Unused through the ioctl: the response goes to CORE_OUT.
                response: 0,
                qp_handle,
                wr_count: 0,
                sge_count: 0,
                wqe_size: KICK_WQE_SIZE,
            },
            response: PostSendResp::default(),
            reserved: 0,
        }
    }

    /// Points the request and response attributes at this call's own fields, at the address
    /// it has now: call it right before handing `self` to the kernel, and do not move the call
    /// in between.
    pub fn aim(&mut self) {
        let base = core::ptr::from_mut(self) as u64;
        self.attrs[1].data = base + offset_of!(KickCall, request) as u64;
        self.attrs[2].data = base + offset_of!(KickCall, response) as u64;
    }
}

const _: () = {
    assert!(size_of::<IoctlHdr>() == 24);
    assert!(offset_of!(IoctlHdr, driver_id) == 16);
    assert!(size_of::<IoctlAttr>() == 16);
    assert!(offset_of!(IoctlAttr, data) == 8);
    assert!(size_of::<PostSend>() == 24);
    assert!(offset_of!(PostSend, qp_handle) == 8);
    assert!(offset_of!(PostSend, wqe_size) == 20);
    assert!(size_of::<PostSendResp>() == 4);
    assert!(size_of::<KickCall>() == 104);
    assert!(offset_of!(KickCall, attrs) == 24);
    assert!(offset_of!(KickCall, request) == 72);
    assert!(offset_of!(KickCall, response) == 96);
};

#[cfg(test)]
mod tests {
    use super::*;

    // The constants and struct layouts are compared with the system's uapi headers in
    // host-device's layout tests.
    #[test]
    fn a_kick_is_an_empty_post_send_of_one_qp_framed_for_invoke_write() {
        let mut call = KickCall::new(7);
        call.aim();
        let base = core::ptr::from_ref(&call) as u64;
        assert_eq!(call.hdr.length, 72, "the header and three attributes");
        assert_eq!(
            (call.hdr.object_id, call.hdr.method_id, call.hdr.num_attrs),
            (0, 0, 3)
        );
        assert_eq!(call.hdr.driver_id, DRIVER_RXE);
        let [cmd, core_in, core_out] = call.attrs;
        assert_eq!((cmd.attr_id, cmd.len, cmd.data), (2, 8, 28));
        assert_eq!(
            (core_in.attr_id, core_in.len, core_in.data),
            (0, 24, base + 72)
        );
        assert_eq!(
            (core_out.attr_id, core_out.len, core_out.data),
            (1, 4, base + 96)
        );
        assert!(call.attrs.iter().all(|a| a.flags == ATTR_F_MANDATORY));
        assert_eq!(
            call.request,
            PostSend {
                response: 0,
                qp_handle: 7,
                wr_count: 0,
                sge_count: 0,
                wqe_size: 128
            }
        );
    }
}

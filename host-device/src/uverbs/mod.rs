//! The kernel's uverbs `write()` command ABI (`include/uapi/rdma/ib_user_verbs.h`, ABI 6) and
//! the framing of one legacy write command.
//!
//! A legacy command is one `write()` on the uverbs character device of
//! `struct ib_uverbs_cmd_hdr` + the core request + the driver's request ("udata in"). `in_words`
//! counts 32-bit words of the whole buffer, header included; `out_words` counts the words of the
//! response buffer, whose address is the request's first member `response`. The kernel
//! (`drivers/infiniband/core/uverbs_main.c`, `ib_uverbs_write`/`verify_hdr`) splits both sides at
//! the size of the core structs declared in `uverbs_def_write_intf[]`: bytes past the core request
//! are the driver's input, bytes of the response past the core response are the driver's output.
//! rdma-core's `libibverbs/cmd_*.c` build exactly these buffers.
//!
//! Every struct here is `#[repr(C)]` with explicit padding; `zerocopy::IntoBytes` refuses implicit
//! padding at compile time, the `abi_layout!` asserts pin sizes and offsets, and a host test
//! compares them with the C compiler's view of the system headers.
//!
//! - `framing.rs`: the command header, the [`Command`] traits, [`frame`] and the layout macros;
//! - one file per object family for the command structs: `context.rs` (context, queries,
//!   completion channels, event descriptors), `ioctl.rs` (the one ioctl method used:
//!   QUERY_GID_TABLE), `pd_mr.rs`, `cq.rs`, `qp.rs` (including the send
//!   kick), `srq.rs`, `ah.rs`.

mod ah;
mod context;
mod cq;
mod framing;
mod ioctl;
mod pd_mr;
mod qp;
mod srq;

pub use ah::*;
pub use context::*;
pub use cq::*;
pub(crate) use framing::{abi_layout, abi_struct};
pub use framing::{
    cmd, frame, frame_ex, CmdHdr, Command, CommandWithResponse, ExCmdHdr, FrameError, ABI_VERSION,
    CMD_FLAG_EXTENDED,
};
pub use ioctl::{
    DeviceMethodCall, GidTableEntry, IoctlAttr, IoctlHdr, DRIVER_RXE, RDMA_VERBS_IOCTL,
};
pub use pd_mr::*;
pub use qp::*;
pub use srq::*;

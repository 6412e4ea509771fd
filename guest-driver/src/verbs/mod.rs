//! The verbs API: what applications use, modelled on ibverbs.
//!
//! A [`Context`] is one open device. Control verbs (query, PD, MR, CQ, QP, SRQ, AH) become control
//! commands of the specification (`vrdma_spec::ControlRequest`) sent over the context's
//! [`Transport`](crate::transport::Transport); the device answers each with a status
//! (mapped to [`VerbsError::Status`]) and, on success, a body.
//!
//! The data path never involves the device except for one notification: [`Cq::poll`] reads
//! native completions and [`Qp::post_recv`] and [`Srq::post_recv`] write native receive WQEs
//! in queue buffers the device mapped into the shared-memory region; [`Qp::post_send`] writes
//! native send WQEs (so does a [`SendBatch`], the `ibv_wr_*` way) and then rings the QP's slot in the context's doorbell area, notifying the
//! device only when the QP was not already queued (spec §5.3). Nothing on that path allocates,
//! and no lock is shared between queues: each CQ, SQ, RQ and SRQ has its own.
//!
//! Object lifetimes follow the device's dependencies: a QP holds its CQs, SRQ and PD, an SRQ,
//! MR or AH its PD, every object its context, so dropping in any order destroys on the device
//! in a legal order (QP before CQ and SRQ, everything before its PD).
//!
//! Events: see [`event`] for how completion and asynchronous events are shared between
//! [`Context::next_event`] and [`Cq::wait_event`].

mod ah;
pub mod cm;
mod command;
mod context;
mod cq;
mod doorbell;
mod error;
pub mod event;
mod gid_cache;
mod mr;
mod mw;
mod pd;
mod qp;
mod ring;
mod send_batch;
mod srq;

/// The name the verbs API's users know the device by: what the drop-in lists
/// (`ibv_device.name` and `dev_name`) and what the guest agent publishes it as.
pub const DEVICE_NAME: &str = "vrdma0";

pub use ah::Ah;
pub use context::Context;
pub use cq::{Cq, CqPollBatch};
pub use error::{opcode_name, PostSendError, ProtocolError, Result, SendBatchError, VerbsError};
pub use event::DeviceEvent;
pub use gid_cache::{GidTable, DEFAULT_GID_CACHE_LIFETIME};
pub use mr::{Mr, MrChange};
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{ConnectOptions, Qp, QpChange, QpInitAttr, RemoteQp};
pub use send_batch::SendBatch;
pub use srq::{Srq, SrqAttr};

pub use crate::provider::{
    inc_rkey, MwBind, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WorkCompletion,
};
pub use vrdma_spec::attr::qp::{GlobalRoute, QpCaps};
pub use vrdma_spec::verbs::{
    AccessFlags, Gid, GidType, Mtu, MwType, QpAttrMask, QpState, QpType, WcOpcode, WcStatus,
    WrOpcode,
};
/// Device, port and GID-table attributes are the wire structs (typed access in
/// `vrdma_spec::attr::query`).
pub use vrdma_spec::wire::{AhAttr, DeviceAttr, GidEntry, PortAttr, QpAttr};

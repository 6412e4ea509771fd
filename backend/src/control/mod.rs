//! Execution of control commands (spec §7) on the host RDMA device.
//!
//! The guest's device decodes a request with the spec crate, checks features and takes the
//! guest's state lock; `dispatch` then routes the decoded [`ControlRequest`] to the handler of
//! its command family, one file each. Each handler validates, in the order the specification
//! gives, everything that depends on device state (handles of this guest only, quotas, guest
//! addresses, state transitions), then calls the host device, and either answers with a body
//! or with a [`CommandError`](error::CommandError) that names the spec status. A failed
//! command changes nothing. What the families share is in [`session`] and [`error`].

pub mod ah;
pub mod cm;
pub mod cq;
pub mod discard;
pub mod doorbell;
pub mod error;
pub mod mr;
pub mod mr_rereg;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod query;
pub mod rings;
pub mod session;
pub mod srq;
pub mod staged_rings;
mod unwind;

use vrdma_spec::ControlRequest;

use session::{CommandResult, Session};

/// Runs one decoded, feature-checked request.
pub(crate) fn dispatch(s: &mut Session<'_>, request: &ControlRequest<'_>) -> CommandResult {
    match request {
        ControlRequest::QueryDevice => query::query_device(s),
        ControlRequest::QueryPort(r) => query::query_port(s, r),
        ControlRequest::QueryGid(r) => query::query_gid(s, r),
        ControlRequest::QueryPkey(r) => query::query_pkey(s, r),
        ControlRequest::QueryGidTable(r) => query::query_gid_table(s, r),
        ControlRequest::SetDoorbellArea(r) => doorbell::set_doorbell_area(s, r),
        ControlRequest::DiscardState => discard::discard_state(s),
        ControlRequest::AllocPd => pd::alloc_pd(s),
        ControlRequest::DeallocPd(r) => pd::dealloc_pd(s, r),
        ControlRequest::RegMr(r) => mr::reg_mr(s, r),
        ControlRequest::RegMrExtents(r) => mr::reg_mr_extents(s, r),
        ControlRequest::DeregMr(r) => mr::dereg_mr(s, r),
        ControlRequest::ReregMr(r) => mr_rereg::rereg_mr(s, r),
        ControlRequest::AllocMw(r) => mw::alloc_mw(s, r),
        ControlRequest::DeallocMw(r) => mw::dealloc_mw(s, r),
        ControlRequest::CreateCq(r) => cq::create_cq(s, r),
        ControlRequest::DestroyCq(r) => cq::destroy_cq(s, r),
        ControlRequest::ArmCq(r) => cq::arm_cq(s, r),
        ControlRequest::ResizeCq(r) => cq::resize_cq(s, r),
        ControlRequest::CreateQp(r) => qp::create_qp(s, r),
        ControlRequest::ModifyQp(r) => qp::modify_qp(s, r),
        ControlRequest::QueryQp(r) => qp::query_qp(s, r),
        ControlRequest::DestroyQp(r) => qp::destroy_qp(s, r),
        ControlRequest::CreateSrq(r) => srq::create_srq(s, r),
        ControlRequest::ModifySrq(r) => srq::modify_srq(s, r),
        ControlRequest::QuerySrq(r) => srq::query_srq(s, r),
        ControlRequest::DestroySrq(r) => srq::destroy_srq(s, r),
        ControlRequest::ResizeSrq(r) => srq::resize_srq(s, r),
        ControlRequest::CreateAh(r) => ah::create_ah(s, r),
        ControlRequest::DestroyAh(r) => ah::destroy_ah(s, r),
        ControlRequest::Cm(r) => cm::dispatch(s, r),
    }
}

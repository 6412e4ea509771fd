//! Asynchronous events on real rxe: an RDMA WRITE with a wrong rkey between two vrdma guests,
//! and a CQ overflowed on purpose, whose CQ_ERR the guest's context must deliver.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::scenarios::backend::Backend;

/// An event by its spec name, with the object it names: ("CQ_ERR", "overflow CQ").
pub type NamedEvent = (String, String);

/// What the asynchronous-event step observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AsyncEventOutcome {
    /// Completion status of the requester's RDMA WRITE with the wrong rkey.
    pub requester_status: String,
    /// The responder QP's state afterwards.
    pub responder_state: String,
    /// Asynchronous events the responder's context delivered, by name ("QP_ACCESS_ERR" …),
    /// with the object they named ("responder QP" …).
    pub responder_events: Vec<NamedEvent>,
    /// Asynchronous events the requester's context delivered.
    pub requester_events: Vec<NamedEvent>,
    /// Capacity of the CQ overflowed on purpose, and the receives flushed into it.
    pub overflow_cq_capacity: u32,
    pub overflow_receives: u32,
    /// Asynchronous events delivered after that overflow.
    pub overflow_events: Vec<NamedEvent>,
}

/// One vrdma guest (its own context on the backend) with an RC QP over rxe0.
struct AsyncSide {
    qp: vrdma::verbs::Qp,
    cq: vrdma::verbs::Cq,
    mr: vrdma::verbs::Mr<'static>,
    pd: vrdma::verbs::Pd,
    ctx: vrdma::verbs::Context,
    gid: vrdma::verbs::Gid,
    psn: u32,
}

fn verbs_err(what: &'static str) -> impl Fn(vrdma::verbs::VerbsError) -> Error {
    move |e| Error::Scenario(format!("{what}: {e}"))
}

impl AsyncSide {
    fn open(socket: &Path, psn: u32) -> Result<Self> {
        use vrdma::verbs::{AccessFlags, Context, Cq, Qp, QpCaps, QpInitAttr, QpType};
        let ctx = Context::connect_process(socket).map_err(verbs_err("opening vrdma"))?;
        let gid = vrdma::verbs::Gid(
            ctx.query_gid(1, 0)
                .map_err(verbs_err("QUERY_GID"))?
                .ok_or_else(|| Error::Scenario("port 1 has no GID 0".into()))?
                .gid,
        );
        let pd = ctx.alloc_pd().map_err(verbs_err("ALLOC_PD"))?;
        let buffer = ctx.alloc_buffer(4096).map_err(verbs_err("buffer"))?;
        let mr = pd
            .register_owned(buffer, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(verbs_err("REG_MR"))?;
        let cq = Cq::new(&ctx, 16).map_err(verbs_err("CREATE_CQ"))?;
        let qp = Qp::new(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(verbs_err("CREATE_QP"))?;
        Ok(Self {
            qp,
            cq,
            mr,
            pd,
            ctx,
            gid,
            psn,
        })
    }

    fn connect(&self, peer: &AsyncSide) -> Result<()> {
        use vrdma::verbs::{ConnectOptions, RemoteQp};
        let opts = ConnectOptions {
            sq_psn: self.psn,
            max_rd_atomic: Some(1),
            max_dest_rd_atomic: Some(1),
            hop_limit: 1,
            ..ConnectOptions::default()
        };
        let remote = RemoteQp {
            qpn: peer.qp.qpn(),
            psn: peer.psn,
            gid: peer.gid,
            lid: 0,
        };
        self.qp
            .to_init(opts.port, opts.access)
            .map_err(verbs_err("QP to INIT"))?;
        self.qp
            .to_rtr(&remote, &opts)
            .map_err(verbs_err("QP to RTR"))?;
        self.qp.to_rts(&opts).map_err(verbs_err("QP to RTS"))
    }

    /// Posts a signaled 64-byte RDMA WRITE from the start of this side's buffer.
    ///
    /// The one `unsafe` of this crate: posting a send is unsafe because the device reads the
    /// SGE's memory later, which the harness needs for this single request.
    #[allow(unsafe_code)]
    fn post_write(&self, remote_addr: u64, rkey: u32) -> Result<()> {
        use vrdma::verbs::{SendFlags, SendWr, WrOpcode};
        let sge = [self.mr.sge(0, 64).expect("64 bytes fit the MR")];
        let wr = SendWr {
            wr_id: 1,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: &sge,
            remote_addr,
            rkey,
            ..SendWr::default()
        };
        // SAFETY: not inline, so nothing is read now; the SGE lies in the buffer that `self.mr`
        // owns and keeps registered, and `self` outlives the request (its QP is destroyed, so
        // the request flushed, before the MR and buffer are dropped).
        unsafe { self.qp.post_send(&[wr]) }
            .map_err(|e| Error::Scenario(format!("posting the RDMA WRITE: {e}")))
    }

    /// Polls the CQ for up to `timeout`.
    fn poll(&self, timeout: Duration) -> Option<vrdma::verbs::WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut wc = [vrdma::verbs::WorkCompletion::default()];
        while std::time::Instant::now() < deadline {
            if self.cq.poll(&mut wc) == 1 {
                return Some(wc[0]);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// Every asynchronous event this context delivers until `quiet` passes without one (or
    /// `total` is over), with the objects named after `names`.
    fn events(
        &self,
        quiet: Duration,
        total: Duration,
        names: &Names<'_>,
    ) -> Result<Vec<NamedEvent>> {
        let deadline = std::time::Instant::now() + total;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self
                .ctx
                .next_event(Some(left.min(quiet)))
                .map_err(verbs_err("waiting for an event"))?
            {
                Some(event) => seen.push(names.describe(&event)),
                None => break,
            }
        }
        Ok(seen)
    }
}

/// Names of the step's QPs and CQs, by guest handle.
struct Names<'a> {
    qps: Vec<(&'a str, u32)>,
    cqs: Vec<(&'a str, u32)>,
}

impl Names<'_> {
    /// An event's spec name and the object it names, e.g. ("QP_ACCESS_ERR", "responder QP").
    fn describe(&self, event: &vrdma::verbs::DeviceEvent) -> (String, String) {
        use vrdma::verbs::DeviceEvent as E;
        let name = |table: &[(&str, u32)], kind: &str, h: u32| {
            table
                .iter()
                .find(|(_, handle)| *handle == h)
                .map_or(format!("unknown {kind} {h:#x}"), |(n, _)| {
                    format!("{n} {kind}")
                })
        };
        let qp = |h| name(&self.qps, "QP", h);
        let cq = |h| name(&self.cqs, "CQ", h);
        let (event_name, subject) = match *event {
            E::QpFatal { qp: h } => ("QP_FATAL", qp(h)),
            E::QpRequestError { qp: h } => ("QP_REQ_ERR", qp(h)),
            E::QpAccessError { qp: h } => ("QP_ACCESS_ERR", qp(h)),
            E::CommunicationEstablished { qp: h } => ("COMM_EST", qp(h)),
            E::SqDrained { qp: h } => ("SQ_DRAINED", qp(h)),
            E::QpLastWqeReached { qp: h } => ("QP_LAST_WQE_REACHED", qp(h)),
            E::CqError { cq: h } => ("CQ_ERR", cq(h)),
            E::Completion { cq: h } => ("COMPLETION", cq(h)),
            other => return (format!("{other:?}"), String::new()),
        };
        (event_name.to_string(), subject)
    }
}

/// Asynchronous events on real rxe.
///
/// 1. Two guests, each with an RC QP on rxe0, connected to each other; the requester
///    RDMA-WRITEs to the responder with a wrong rkey. The requester's write completes with
///    REM_ACCESS_ERR and the responder's QP goes to the error state. rxe (6.12) raises no
///    asynchronous event for that on either side (no QP_ACCESS_ERR, no QP_FATAL): whatever
///    the contexts deliver is recorded, not required.
/// 2. The responder's guest overflows a CQ: a QP whose CQ holds `c` entries gets `c + 2`
///    receives and is moved to ERR, so rxe flushes them into the full CQ and raises
///    IB_EVENT_CQ_ERR. The guest's context must deliver CQ_ERR naming that CQ by its handle.
pub(super) fn run(backend: &Backend) -> Result<AsyncEventOutcome> {
    use vrdma::verbs::{RecvWr, WcStatus};
    let requester = AsyncSide::open(&backend.socket, 0x1234)?;
    let responder = AsyncSide::open(&backend.socket, 0x5678)?;
    requester.connect(&responder)?;
    responder.connect(&requester)?;
    let recv_sge = [responder.mr.sge(0, 64).expect("64 bytes fit the MR")];
    responder
        .qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &recv_sge,
        }])
        .map_err(|(_, e)| Error::Scenario(format!("posting a receive: {e}")))?;

    let wrong_rkey = responder.mr.rkey() ^ 0x00ff_ff00;
    requester.post_write(responder.mr.addr(), wrong_rkey)?;
    let wc = requester
        .poll(Duration::from_secs(30))
        .ok_or_else(|| Error::Scenario("the RDMA WRITE never completed".into()))?;

    let mut names = Names {
        qps: vec![
            ("requester", requester.qp.handle()),
            ("responder", responder.qp.handle()),
        ],
        cqs: vec![
            ("requester", requester.cq.handle()),
            ("responder", responder.cq.handle()),
        ],
    };
    let responder_events =
        responder.events(Duration::from_secs(2), Duration::from_secs(10), &names)?;
    let requester_events =
        requester.events(Duration::from_millis(500), Duration::from_secs(5), &names)?;
    let responder_state = responder
        .qp
        .state()
        .map_err(verbs_err("QUERY_QP of the responder"))?;
    println!("  requester WRITE completion: {:?}", wc.status);
    println!("  responder QP state: {responder_state:?}");
    println!("  responder events: {responder_events:?}");
    println!("  requester events: {requester_events:?}");
    if wc.status != WcStatus::RemAccessErr {
        return Err(Error::Scenario(format!(
            "the wrong-rkey WRITE completed with {:?}, expected RemAccessErr",
            wc.status
        )));
    }
    if responder_state != vrdma::verbs::QpState::Err {
        return Err(Error::Scenario(format!(
            "the responder's QP is {responder_state:?} after the access error, not Err"
        )));
    }

    let (capacity, receives, overflow_events) = overflow_cq(&responder, &mut names)?;
    println!("  CQ of {capacity} entries, {receives} receives flushed: events {overflow_events:?}");
    let outcome = AsyncEventOutcome {
        requester_status: format!("{:?}", wc.status),
        responder_state: format!("{responder_state:?}"),
        responder_events,
        requester_events,
        overflow_cq_capacity: capacity,
        overflow_receives: receives,
        overflow_events,
    };
    let expected = ("CQ_ERR".to_string(), "overflow CQ".to_string());
    if !outcome.overflow_events.contains(&expected) {
        return Err(Error::Scenario(format!(
            "the guest's context did not deliver {expected:?} after the overflow: {:?}",
            outcome.overflow_events
        )));
    }
    println!("  ok: the guest's context delivered {expected:?}");
    Ok(outcome)
}

/// Overflows a CQ of `side`'s guest (see [`run`]); returns its capacity, the
/// receives flushed into it and the events that followed.
fn overflow_cq(side: &AsyncSide, names: &mut Names<'_>) -> Result<(u32, u32, Vec<NamedEvent>)> {
    use vrdma::verbs::{AccessFlags, Cq, Qp, QpCaps, QpInitAttr, QpType, RecvWr};
    let cq = Cq::new(&side.ctx, 1).map_err(verbs_err("CREATE_CQ of 1 entry"))?;
    let capacity = cq.capacity();
    let receives = capacity + 2;
    let qp = Qp::new(
        &side.pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: receives,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )
    .map_err(verbs_err("CREATE_QP on the small CQ"))?;
    qp.to_init(1, AccessFlags::LOCAL_WRITE)
        .map_err(verbs_err("QP to INIT"))?;
    let sge = [side.mr.sge(0, 64).expect("64 bytes fit the MR")];
    for wr_id in 0..u64::from(receives) {
        qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: &sge,
        }])
        .map_err(|(_, e)| Error::Scenario(format!("posting receive {wr_id}: {e}")))?;
    }
    names.qps.push(("overflow", qp.handle()));
    names.cqs.push(("overflow", cq.handle()));
    qp.to_error().map_err(verbs_err("QP to ERR"))?;
    let events = side.events(Duration::from_secs(2), Duration::from_secs(10), names)?;
    Ok((capacity, receives, events))
}

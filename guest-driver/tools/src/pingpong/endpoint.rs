//! One side's RDMA resources over the vrdma verbs API: the buffer, CQs, queue pairs.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, ConnectOptions, Context, Cq, GlobalRoute, Mr, Mtu, Pd, Qp, QpCaps,
    QpInitAttr, QpType, RecvWr, RemoteQp, Sge, VerbsError,
};

use super::exchange::Hello;
use super::options::PathAttrs;
use super::plan::{Plan, MAX_WINDOW};
use super::{MAX_INLINE, UD_QKEY};

/// Port every queue pair uses.
pub const PORT: u8 = 1;
/// GID index every queue pair sends from.
pub const GID_INDEX: u8 = 0;
/// RC queue depths: a full bandwidth window plus the control messages around it.
const RC_DEPTH: u32 = MAX_WINDOW + 8;
/// UD queue depths (one message in flight each way).
const UD_DEPTH: u32 = 16;
/// Entries of each CQ: every queue's completions fit.
const CQ_DEPTH: u32 = 512;

/// `wr_id` of RC receives.
pub const WRID_RC_RECV: u64 = 1;
/// `wr_id` of UD receives.
pub const WRID_UD_RECV: u64 = 2;
/// `wr_id` of every send-queue request.
pub const WRID_SEND: u64 = 3;

/// Why the resources could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{what}: {source}")]
    Verbs {
        what: &'static str,
        #[source]
        source: VerbsError,
    },
    #[error("{0}")]
    Unusable(String),
}

fn verbs(what: &'static str) -> impl FnOnce(VerbsError) -> EndpointError {
    move |source| EndpointError::Verbs { what, source }
}

/// The UD queue pair and, once connected, the address handle towards the peer.
pub struct UdEnd {
    pub ah: Option<Ah>,
    pub qp: Qp,
    pub max_inline: u32,
}

/// Everything one side registers and creates. Fields drop in declaration order: queue pairs
/// before their CQs, the memory region before its PD.
pub struct Endpoint {
    pub ud: Option<UdEnd>,
    pub qp: Qp,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub mr: Mr<'static>,
    pub pd: Pd,
    pub ctx: Context,
    /// Length of the area (and of the source half after it).
    pub len: u64,
    pub max_inline: u32,
    /// What the peer is told.
    pub hello: Hello,
}

impl Endpoint {
    /// Creates the resources `plan` needs with an area of `len` bytes, and the hello that
    /// describes them.
    pub fn new(ctx: &Context, plan: &Plan, len: u64) -> Result<Endpoint, EndpointError> {
        let port = ctx.query_port(PORT).map_err(verbs("querying port 1"))?;
        if !port.is_active() {
            return Err(EndpointError::Unusable("port 1 is not active".into()));
        }
        if port.active_mtu().is_none_or(|mtu| mtu < Mtu::Mtu1024) {
            return Err(EndpointError::Unusable(format!(
                "port 1 MTU value {} is below 1024",
                port.active_mtu
            )));
        }
        let gid = ctx
            .query_gid(PORT, GID_INDEX.into())
            .map_err(verbs("querying GID 0"))?
            .ok_or_else(|| EndpointError::Unusable("port 1 has no GID at index 0".into()))?
            .gid;
        let pd = ctx.alloc_pd().map_err(verbs("allocating a PD"))?;
        let bytes = usize::try_from(2 * len)
            .map_err(|_| EndpointError::Unusable(format!("area of {len} bytes is too large")))?;
        let buffer = ctx
            .alloc_buffer(bytes)
            .map_err(verbs("allocating the buffer"))?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = pd
            .register_owned(buffer, access)
            .map_err(verbs("registering the buffer"))?;
        let send_cq = Cq::new(ctx, CQ_DEPTH).map_err(verbs("creating the send CQ"))?;
        let recv_cq = Cq::new(ctx, CQ_DEPTH).map_err(verbs("creating the receive CQ"))?;
        let init = |qp_type, depth| QpInitAttr {
            qp_type,
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: MAX_INLINE,
            },
            sq_sig_all: false,
        };
        let qp = Qp::new(&pd, &init(QpType::Rc, RC_DEPTH)).map_err(verbs("creating the RC QP"))?;
        let ud = if plan.uses_ud() {
            let qp =
                Qp::new(&pd, &init(QpType::Ud, UD_DEPTH)).map_err(verbs("creating the UD QP"))?;
            Some(UdEnd {
                ah: None,
                max_inline: qp.caps().max_inline_data,
                qp,
            })
        } else {
            None
        };
        let hello = Hello {
            qpn: qp.qpn(),
            psn: random_psn(),
            gid,
            rkey: mr.rkey(),
            addr: mr.addr(),
            len,
            plan: plan.clone(),
            ud_qpn: ud.as_ref().map(|ud| ud.qp.qpn()),
        };
        Ok(Endpoint {
            max_inline: qp.caps().max_inline_data,
            ud,
            qp,
            send_cq,
            recv_cq,
            mr,
            pd,
            ctx: ctx.clone(),
            len,
            hello,
        })
    }

    /// Brings the queue pairs to RTS towards `peer` (the RC QP with `path`) and posts every
    /// receive, the RC ones only with `rc_receives` (else [`Endpoint::post_rc_receives`]
    /// later).
    pub fn connect(
        &mut self,
        peer: &Hello,
        path: &PathAttrs,
        rc_receives: bool,
    ) -> Result<(), EndpointError> {
        let opts = ConnectOptions {
            port: PORT,
            sgid_index: GID_INDEX,
            sq_psn: self.hello.psn,
            path_mtu: path.mtu,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: path.rnr_retry,
            min_rnr_timer: path.min_rnr_timer,
            max_rd_atomic: Some(1),
            max_dest_rd_atomic: Some(1),
            hop_limit: 1,
            ..ConnectOptions::default()
        };
        let remote = RemoteQp {
            qpn: peer.qpn,
            psn: peer.psn,
            gid: vrdma::verbs::Gid(peer.gid),
            lid: 0,
        };
        self.qp
            .to_init(PORT, opts.access)
            .map_err(verbs("moving the RC QP to INIT"))?;
        if rc_receives {
            self.post_rc_receives()?;
        }
        self.qp
            .to_rtr(&remote, &opts)
            .map_err(verbs("moving the RC QP to RTR"))?;
        self.qp
            .to_rts(&opts)
            .map_err(verbs("moving the RC QP to RTS"))?;
        if let Some(ud) = &self.ud {
            ud.qp
                .ud_to_rts(PORT, UD_QKEY, self.hello.psn)
                .map_err(verbs("bringing the UD QP to RTS"))?;
            for _ in 0..UD_DEPTH {
                self.post_recv(true)?;
            }
            let attr = AhAttr::default()
                .with_grh(GlobalRoute {
                    dgid: vrdma::verbs::Gid(peer.gid),
                    flow_label: 0,
                    sgid_index: GID_INDEX,
                    hop_limit: 1,
                    traffic_class: 0,
                })
                .with_port_num(PORT);
            let ah = Ah::new(&self.pd, &attr).map_err(verbs("creating the address handle"))?;
            if let Some(ud) = &mut self.ud {
                ud.ah = Some(ah);
            }
        }
        Ok(())
    }

    /// Posts the RC queue pair's receives.
    pub fn post_rc_receives(&self) -> Result<(), EndpointError> {
        for _ in 0..RC_DEPTH {
            self.post_recv(false)?;
        }
        Ok(())
    }

    /// Posts one receive naming the whole area on the RC (or UD) queue pair.
    pub fn post_recv(&self, ud: bool) -> Result<(), EndpointError> {
        let sge = [self.area_sge(self.len as usize)];
        let (qp, wr_id) = match (&self.ud, ud) {
            (Some(end), true) => (&end.qp, WRID_UD_RECV),
            _ => (&self.qp, WRID_RC_RECV),
        };
        qp.post_recv(&[RecvWr {
            wr_id,
            sg_list: &sge,
        }])
        .map_err(|(_, e)| EndpointError::Unusable(format!("posting a receive: {e}")))
    }

    /// An SGE over the first `len` bytes of the area.
    pub fn area_sge(&self, len: usize) -> Sge {
        self.mr.sge(0, len).expect("the region holds the area")
    }

    /// An SGE over the first `len` bytes of the source half.
    pub fn source_sge(&self, len: usize) -> Sge {
        self.mr
            .sge(self.len as usize, len)
            .expect("the region holds the source half")
    }

    /// The first `len` bytes of the area, to verify what arrived.
    ///
    /// Call only while the peer has no write or send towards the area outstanding, which the
    /// protocol's lockstep guarantees after the completion that announced the data.
    pub fn area(&self, offset: usize, len: usize) -> &[u8] {
        let buffer = self.mr.buffer().expect("the region owns its buffer");
        &buffer.as_slice()[offset..offset + len]
    }

    /// The first `len` bytes of the area, writable (the server fills it for `read`).
    ///
    /// Call only while no peer read or write of the area is outstanding (protocol lockstep).
    pub fn area_mut(&mut self, len: usize) -> &mut [u8] {
        self.half_mut(0, len)
    }

    /// The first `len` bytes of the source half, writable.
    ///
    /// Call only while no send-queue request reading the source is outstanding.
    pub fn source_mut(&mut self, len: usize) -> &mut [u8] {
        self.half_mut(self.len as usize, len)
    }

    fn half_mut(&mut self, offset: usize, len: usize) -> &mut [u8] {
        let buffer = self.mr.buffer().expect("the region owns its buffer");
        assert!(offset + len <= buffer.len(), "range inside the buffer");
        // SAFETY: the range lies inside the buffer the region owns, which lives as long as
        // `self`; `&mut self` excludes every other view made through this endpoint, and the
        // callers' contracts exclude device access to the range meanwhile.
        unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().add(offset), len) }
    }
}

/// A random 24-bit PSN (std's per-process random hash keys, so no extra dependency).
fn random_psn() -> u32 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    (hasher.finish() & 0xff_ffff) as u32
}

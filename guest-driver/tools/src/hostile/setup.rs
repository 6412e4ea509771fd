//! What every attack starts from: the attacker's PD, CQ, buffer and own addresses, and the
//! queue pairs it builds from them.

use std::time::{Duration, Instant};

use vrdma::verbs::{
    AccessFlags, Ah, AhAttr, Context, Cq, Gid, GlobalRoute, Mr, Pd, Qp, QpCaps, QpInitAttr, QpType,
    RecvWr, Sge, VerbsError, WorkCompletion,
};

/// Why an attack could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A legitimate command failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Posting a legitimate work request failed.
    #[error("posting a work request: {0}")]
    Post(String),
}

/// Results of the set-up steps.
pub type Result<T, E = SetupError> = std::result::Result<T, E>;

/// Port of every queue pair.
pub const PORT: u8 = 1;
/// Q_Key of every UD queue pair.
pub const QKEY: u32 = 0x1111_1111;
/// Bytes of each side's buffer.
const BUFFER: usize = 64 << 10;
/// Longest wait for one completion: long enough for a loaded TCG machine, short enough that a
/// device that dropped a work request is reported instead of hanging the suite.
pub const COMPLETION_BOUND: Duration = Duration::from_secs(60);

/// The attacker's (or the victim's) device and the objects the attacks share.
pub struct Kit {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr<'static>,
    /// The guest's first own GID (index 0 of its table).
    pub gid: Gid,
    /// How many GID entries the guest's table holds (indices `0..own_gids` are its own).
    pub own_gids: u32,
}

impl Kit {
    /// Opens the kit on `ctx`.
    pub fn new(ctx: &Context) -> Result<Kit> {
        let pd = ctx.alloc_pd()?;
        let cq = Cq::new(ctx, 256)?;
        let buffer = ctx.alloc_buffer(BUFFER)?;
        let mr = pd.register_owned(buffer, AccessFlags::LOCAL_WRITE)?;
        let table = ctx.query_gid_table(PORT)?;
        let gid = table
            .first()
            .map(|(_, entry)| Gid(entry.gid))
            .unwrap_or(Gid([0; 16]));
        let own_gids = table.last().map_or(0, |(index, _)| index + 1);
        Ok(Kit {
            ctx: ctx.clone(),
            pd,
            cq,
            mr,
            gid,
            own_gids,
        })
    }

    /// A queue pair of `qp_type` on the kit's CQ.
    pub fn qp(&self, qp_type: QpType) -> Result<Qp> {
        Ok(Qp::new(
            &self.pd,
            &QpInitAttr {
                qp_type,
                send_cq: &self.cq,
                recv_cq: &self.cq,
                caps: QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            },
        )?)
    }

    /// A UD queue pair in RTS with receives posted.
    pub fn ud_qp(&self) -> Result<Qp> {
        let qp = self.qp(QpType::Ud)?;
        qp.ud_to_rts(PORT, QKEY, 0)?;
        for i in 0..4 {
            qp.post_recv(&[RecvWr {
                wr_id: 0x5ec0 + i,
                sg_list: &[self.sge(0, 1024)],
            }])
            .map_err(|(_, e)| SetupError::Post(e.to_string()))?;
        }
        Ok(qp)
    }

    /// An address handle to `dgid` from the guest's GID `sgid_index`.
    pub fn ah(&self, dgid: Gid, sgid_index: u8, traffic_class: u8) -> Result<Ah, VerbsError> {
        Ah::new(&self.pd, &ah_attr(dgid, sgid_index, traffic_class))
    }

    /// `len` bytes of the kit's buffer at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        self.mr.sge(offset, len).expect("within the kit's buffer")
    }

    /// The next completion on the kit's CQ, within [`COMPLETION_BOUND`].
    pub fn next_completion(&self) -> Option<WorkCompletion> {
        let deadline = Instant::now() + COMPLETION_BOUND;
        let mut wc = [WorkCompletion::default()];
        while Instant::now() < deadline {
            if self.cq.poll(&mut wc) == 1 {
                return Some(wc[0]);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// Completions already on the CQ, without waiting.
    pub fn drain(&self) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wc = [WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut wc);
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&wc[..n]);
        }
    }
}

/// A RoCE address vector on [`PORT`].
pub fn ah_attr(dgid: Gid, sgid_index: u8, traffic_class: u8) -> AhAttr {
    AhAttr::default()
        .with_grh(GlobalRoute {
            dgid,
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class,
        })
        .with_port_num(PORT)
}

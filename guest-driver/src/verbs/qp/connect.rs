//! Connecting QPs: the RESET → INIT → RTR → RTS transitions of connected QPs (one QP at a time
//! or many in one batch of commands) and of UD QPs.

use vrdma_spec::attr::qp::GlobalRoute;
use vrdma_spec::verbs::{AccessFlags, QpAttrMask, QpState, QpType};
use vrdma_spec::wire::{AhAttr, QpAttr};

use super::{rd_atomic, ConnectOptions, Qp, QpChange, RemoteQp};
use crate::verbs::error::{Result, VerbsError};

impl Qp {
    /// RESET → INIT of a connected (RC or UC) QP on `port` with remote `access`, P_Key
    /// index 0.
    pub fn to_init(&self, port: u8, access: AccessFlags) -> Result<()> {
        let (attr, mask) = self.init_change(port, access)?;
        self.modify(&attr, mask)
    }

    fn init_change(&self, port: u8, access: AccessFlags) -> Result<(QpAttr, QpAttrMask)> {
        self.require_connected()?;
        let attr = QpAttr::default()
            .with_qp_state(QpState::Init)
            .with_port_num(port)
            .with_pkey_index(0)
            .with_qp_access_flags(access);
        let mask = QpAttrMask::STATE
            | QpAttrMask::PKEY_INDEX
            | QpAttrMask::PORT
            | QpAttrMask::ACCESS_FLAGS;
        Ok((attr, mask))
    }

    /// INIT → RTR of a connected QP towards `remote`; an RC QP also sets its responder
    /// resources and RNR timer.
    pub fn to_rtr(&self, remote: &RemoteQp, opts: &ConnectOptions) -> Result<()> {
        let (attr, mask) = self.rtr_change(remote, opts)?;
        self.modify(&attr, mask)
    }

    fn rtr_change(&self, remote: &RemoteQp, opts: &ConnectOptions) -> Result<(QpAttr, QpAttrMask)> {
        self.require_connected()?;
        let path = AhAttr::default()
            .with_grh(GlobalRoute {
                dgid: remote.gid,
                flow_label: 0,
                sgid_index: opts.sgid_index,
                hop_limit: opts.hop_limit,
                traffic_class: opts.traffic_class,
            })
            .with_dlid(remote.lid)
            .with_sl(opts.sl)
            .with_port_num(opts.port);
        let attr = QpAttr::default()
            .with_qp_state(QpState::Rtr)
            .with_path_mtu(opts.path_mtu)
            .with_dest_qp_num(remote.qpn)
            .with_rq_psn(remote.psn)
            .with_ah_attr(path);
        let mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN;
        if self.qp_type != QpType::Rc {
            return Ok((attr, mask));
        }
        let limit = self.object.ctx().device_attr().max_qp_rd_atom.get();
        let attr = attr
            .with_max_dest_rd_atomic(rd_atomic(opts.max_dest_rd_atomic, limit))
            .with_min_rnr_timer(opts.min_rnr_timer);
        Ok((
            attr,
            mask | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER,
        ))
    }

    /// RTR → RTS of a connected QP; an RC QP also sets its timeout, retries and read depth.
    pub fn to_rts(&self, opts: &ConnectOptions) -> Result<()> {
        let (attr, mask) = self.rts_change(opts)?;
        self.modify(&attr, mask)
    }

    fn rts_change(&self, opts: &ConnectOptions) -> Result<(QpAttr, QpAttrMask)> {
        self.require_connected()?;
        let attr = QpAttr::default()
            .with_qp_state(QpState::Rts)
            .with_sq_psn(opts.sq_psn);
        if self.qp_type != QpType::Rc {
            return Ok((attr, QpAttrMask::STATE | QpAttrMask::SQ_PSN));
        }
        let limit = self.object.ctx().device_attr().max_qp_init_rd_atom.get();
        let attr = attr
            .with_timeout(opts.timeout)
            .with_retry_cnt(opts.retry_cnt)
            .with_rnr_retry(opts.rnr_retry)
            .with_max_rd_atomic(rd_atomic(opts.max_rd_atomic, limit));
        let mask = QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
        Ok((attr, mask))
    }

    /// The INIT, RTR and RTS modifications that connect this QP to `remote`.
    fn connect_changes(
        &self,
        remote: &RemoteQp,
        opts: &ConnectOptions,
    ) -> Result<[(QpAttr, QpAttrMask); 3]> {
        Ok([
            self.init_change(opts.port, opts.access)?,
            self.rtr_change(remote, opts)?,
            self.rts_change(opts)?,
        ])
    }

    /// Connects an RC or UC QP in RESET to `remote`: INIT, RTR, RTS.
    pub fn connect(&self, remote: &RemoteQp, opts: &ConnectOptions) -> Result<()> {
        for (attr, mask) in self.connect_changes(remote, opts)? {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// Connects several RC or UC QPs of one context, each in RESET, to their remotes with one
    /// batch of commands: every QP's INIT, RTR and RTS in order, one round trip in all where
    /// the transport batches. Each result is that QP's (its first failed step).
    pub fn connect_many(
        targets: &[(&Qp, RemoteQp)],
        opts: &ConnectOptions,
    ) -> Result<Vec<Result<()>>> {
        let mut plans = Vec::with_capacity(targets.len());
        for (qp, remote) in targets {
            plans.push(qp.connect_changes(remote, opts)?);
        }
        let changes: Vec<QpChange<'_>> = targets
            .iter()
            .zip(&plans)
            .flat_map(|((qp, _), plan)| {
                plan.iter().map(move |(attr, mask)| QpChange {
                    qp,
                    attr,
                    mask: *mask,
                })
            })
            .collect();
        let mut answers = Self::modify_many(&changes)?.into_iter();
        Ok(targets
            .iter()
            .map(|_| {
                let steps: Vec<Result<()>> = answers.by_ref().take(3).collect();
                steps.into_iter().collect::<Result<()>>()
            })
            .collect())
    }

    /// Brings a UD QP from RESET to RTS on `port` with Q_Key `qkey`, P_Key index 0.
    pub fn ud_to_rts(&self, port: u8, qkey: u32, sq_psn: u32) -> Result<()> {
        if self.qp_type != QpType::Ud {
            return Err(VerbsError::InvalidArgument(
                "this transition helper is for UD QPs",
            ));
        }
        let init = QpAttr::default()
            .with_qp_state(QpState::Init)
            .with_port_num(port)
            .with_pkey_index(0)
            .with_qkey(qkey);
        self.modify(
            &init,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )?;
        let rtr = QpAttr::default().with_qp_state(QpState::Rtr);
        self.modify(&rtr, QpAttrMask::STATE)?;
        let rts = QpAttr::default()
            .with_qp_state(QpState::Rts)
            .with_sq_psn(sq_psn);
        self.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }
}

//! Attribute types of the verbs API and their wire forms.
//!
//! Values are those of rdma-core's `<infiniband/verbs.h>`, which the device carries unchanged;
//! the types here only make the valid ones explicit. Device, port and GID attributes have no
//! type here: the verbs API hands out the wire structs (typed access in
//! `vrdma_spec::attr::query`).

use std::fmt;
use std::net::Ipv6Addr;

use vrdma_spec::wire;
use vrdma_spec::{Le16, Le32};

pub use vrdma_spec::verbs::{AccessFlags, GidType, Mtu, QpAttrMask, QpState};

/// A GID, in network byte order as in `union ibv_gid`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The raw bytes.
    pub const fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// True for the all-zero GID (an empty table entry).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The global routing header of an address vector (`ibv_global_route`); mandatory on RoCE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the local port's table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// An address vector (`ibv_ah_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    /// Global routing; `None` only makes sense on InfiniBand ports.
    pub grh: Option<GlobalRoute>,
    /// Destination LID (InfiniBand only).
    pub dlid: u16,
    /// Service level (0..=15).
    pub sl: u8,
    /// Source path bits (InfiniBand only).
    pub src_path_bits: u8,
    /// Static rate (`ibv_rate`); 0 = port rate.
    pub static_rate: u8,
    /// Local port (1-based).
    pub port_num: u8,
}

impl AhAttr {
    /// Wire form.
    pub fn to_wire(&self) -> wire::AhAttr {
        let grh = self.grh.unwrap_or_default();
        wire::AhAttr {
            dgid: grh.dgid.0,
            flow_label: Le32::new(grh.flow_label),
            sgid_index: grh.sgid_index,
            hop_limit: grh.hop_limit,
            traffic_class: grh.traffic_class,
            sl: self.sl,
            dlid: Le16::new(self.dlid),
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: u8::from(self.grh.is_some()),
            port_num: self.port_num,
            reserved: Le16::ZERO,
        }
    }

    /// From the wire form (as returned by QUERY_QP).
    pub fn from_wire(w: &wire::AhAttr) -> Self {
        AhAttr {
            grh: (w.is_global != 0).then(|| GlobalRoute {
                dgid: Gid(w.dgid),
                flow_label: w.flow_label.get(),
                sgid_index: w.sgid_index,
                hop_limit: w.hop_limit,
                traffic_class: w.traffic_class,
            }),
            dlid: w.dlid.get(),
            sl: w.sl,
            src_path_bits: w.src_path_bits,
            static_rate: w.static_rate,
            port_num: w.port_num,
        }
    }
}

/// Queue sizes of a QP (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send request.
    pub max_send_sge: u32,
    /// SGEs per receive request.
    pub max_recv_sge: u32,
    /// Inline bytes per send request.
    pub max_inline_data: u32,
}

/// QP attributes (`ibv_qp_attr`). MODIFY_QP applies the ones a [`QpAttrMask`] selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Next state.
    pub qp_state: QpState,
    /// Expected current state (with [`QpAttrMask::CUR_STATE`]).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Path migration state (0 migrated, 1 rearm, 2 armed).
    pub path_mig_state: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN (24 bits).
    pub rq_psn: u32,
    /// Send PSN (24 bits).
    pub sq_psn: u32,
    /// Remote QP number (24 bits).
    pub dest_qp_num: u32,
    /// Remote access allowed on this QP.
    pub qp_access_flags: AccessFlags,
    /// Queue sizes (QUERY_QP only).
    pub cap: QpCaps,
    /// Primary path.
    pub ah_attr: AhAttr,
    /// Alternate path.
    pub alt_ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Ask for an SQ_DRAINED event when entering SQD.
    pub en_sqd_async_notify: bool,
    /// The send queue is draining (QUERY_QP only).
    pub sq_draining: bool,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer (0..=31).
    pub min_rnr_timer: u8,
    /// Local port.
    pub port_num: u8,
    /// Local ACK timeout (0..=31).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate path ACK timeout.
    pub alt_timeout: u8,
    /// Rate limit (never accepted for RC/UD).
    pub rate_limit: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::default(),
            path_mig_state: 0,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCaps::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

impl QpAttr {
    /// Wire form. Every field is written; the device ignores those the mask does not select.
    pub fn to_wire(&self) -> wire::QpAttr {
        wire::QpAttr {
            qp_state: Le32::new(self.qp_state as u32),
            cur_qp_state: Le32::new(self.cur_qp_state as u32),
            path_mtu: Le32::new(self.path_mtu as u32),
            path_mig_state: Le32::new(self.path_mig_state),
            qkey: Le32::new(self.qkey),
            rq_psn: Le32::new(self.rq_psn),
            sq_psn: Le32::new(self.sq_psn),
            dest_qp_num: Le32::new(self.dest_qp_num),
            qp_access_flags: Le32::new(self.qp_access_flags.bits()),
            max_send_wr: Le32::new(self.cap.max_send_wr),
            max_recv_wr: Le32::new(self.cap.max_recv_wr),
            max_send_sge: Le32::new(self.cap.max_send_sge),
            max_recv_sge: Le32::new(self.cap.max_recv_sge),
            max_inline_data: Le32::new(self.cap.max_inline_data),
            ah_attr: self.ah_attr.to_wire(),
            alt_ah_attr: self.alt_ah_attr.to_wire(),
            pkey_index: Le16::new(self.pkey_index),
            alt_pkey_index: Le16::new(self.alt_pkey_index),
            en_sqd_async_notify: u8::from(self.en_sqd_async_notify),
            sq_draining: 0,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            port_num: self.port_num,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            alt_port_num: self.alt_port_num,
            alt_timeout: self.alt_timeout,
            reserved0: 0,
            rate_limit: Le32::new(self.rate_limit),
            reserved1: Le32::ZERO,
        }
    }

    /// From the wire form of a QUERY_QP response; the error names the first field whose
    /// value is not defined. Fields outside `valid` are not interpreted (left at defaults).
    pub fn from_wire(w: &wire::QpAttr, valid: QpAttrMask) -> Result<Self, (&'static str, u64)> {
        let state = |field, v: u32| QpState::try_from(v).map_err(|v| (field, u64::from(v)));
        let mut attr = QpAttr::default();
        if valid.contains(QpAttrMask::STATE) {
            attr.qp_state = state("qp_state", w.qp_state.get())?;
        }
        if valid.contains(QpAttrMask::CUR_STATE) {
            attr.cur_qp_state = state("cur_qp_state", w.cur_qp_state.get())?;
        }
        if valid.contains(QpAttrMask::PATH_MTU) {
            attr.path_mtu =
                Mtu::try_from(w.path_mtu.get()).map_err(|v| ("path_mtu", u64::from(v)))?;
        }
        if valid.contains(QpAttrMask::ACCESS_FLAGS) {
            let bits = w.qp_access_flags.get();
            attr.qp_access_flags = AccessFlags::from_bits(bits & AccessFlags::QP_ALLOWED.bits())
                .filter(|f| f.bits() == bits)
                .ok_or(("qp_access_flags", u64::from(bits)))?;
        }
        attr.path_mig_state = w.path_mig_state.get();
        attr.qkey = w.qkey.get();
        attr.rq_psn = w.rq_psn.get();
        attr.sq_psn = w.sq_psn.get();
        attr.dest_qp_num = w.dest_qp_num.get();
        attr.cap = QpCaps {
            max_send_wr: w.max_send_wr.get(),
            max_recv_wr: w.max_recv_wr.get(),
            max_send_sge: w.max_send_sge.get(),
            max_recv_sge: w.max_recv_sge.get(),
            max_inline_data: w.max_inline_data.get(),
        };
        attr.ah_attr = AhAttr::from_wire(&w.ah_attr);
        attr.alt_ah_attr = AhAttr::from_wire(&w.alt_ah_attr);
        attr.pkey_index = w.pkey_index.get();
        attr.alt_pkey_index = w.alt_pkey_index.get();
        attr.en_sqd_async_notify = w.en_sqd_async_notify != 0;
        attr.sq_draining = w.sq_draining != 0;
        attr.max_rd_atomic = w.max_rd_atomic;
        attr.max_dest_rd_atomic = w.max_dest_rd_atomic;
        attr.min_rnr_timer = w.min_rnr_timer;
        attr.port_num = w.port_num;
        attr.timeout = w.timeout;
        attr.retry_cnt = w.retry_cnt;
        attr.rnr_retry = w.rnr_retry;
        attr.alt_port_num = w.alt_port_num;
        attr.alt_timeout = w.alt_timeout;
        attr.rate_limit = w.rate_limit.get();
        Ok(attr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attr_round_trips_through_the_wire_form() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            cur_qp_state: QpState::Init,
            path_mtu: Mtu::Mtu4096,
            qkey: 0x1111_1111,
            rq_psn: 0xabcdef,
            sq_psn: 0x123456,
            dest_qp_num: 0x42,
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            ah_attr: AhAttr {
                grh: Some(GlobalRoute {
                    dgid: Gid::from("fe80::1".parse::<Ipv6Addr>().unwrap()),
                    flow_label: 0xfffff,
                    sgid_index: 1,
                    hop_limit: 64,
                    traffic_class: 3,
                }),
                sl: 2,
                port_num: 1,
                ..AhAttr::default()
            },
            pkey_index: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            ..QpAttr::default()
        };
        let wire = attr.to_wire();
        assert_eq!(wire.ah_attr.is_global, 1);
        assert_eq!(wire.ah_attr.dgid[..2], [0xfe, 0x80]);
        assert_eq!(wire.path_mtu.get(), 5);
        let back = QpAttr::from_wire(&wire, QpAttrMask::ALL).unwrap();
        assert_eq!(back, attr);
    }

    #[test]
    fn undefined_values_from_the_device_are_named() {
        let mut wire = QpAttr::default().to_wire();
        wire.qp_state = Le32::new(9);
        assert_eq!(
            QpAttr::from_wire(&wire, QpAttrMask::STATE),
            Err(("qp_state", 9))
        );
        // Not selected: not interpreted.
        assert!(QpAttr::from_wire(&wire, QpAttrMask::PATH_MTU).is_ok());
    }
}

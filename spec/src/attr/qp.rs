//! QP and address-handle attributes: typed setters and getters on [`QpAttr`] and [`AhAttr`],
//! the one Rust form of `ibv_qp_attr` and `ibv_ah_attr` that the driver, the drop-in library
//! and the device share.
//!
//! The wire structs keep every value as it arrived; the getters of enumerated fields decode
//! and refuse undefined values with [`UndefinedValue`], naming the field. Builders (`with_*`)
//! take the typed values and write the little-endian fields.

use zerocopy::FromZeros;

use crate::verbs::{AccessFlags, Gid, Mtu, QpAttrMask, QpState, MAX_FLOW_LABEL};
use crate::wire::{AhAttr, QpAttr};
use crate::{Le16, Le32};

/// An attribute field holds a value the verbs ABI does not define.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("attribute `{field}` has the undefined value {value:#x}")]
pub struct UndefinedValue {
    /// The field, as named in `ibv_qp_attr`.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
}

/// Queue sizes of a QP (`ibv_qp_cap`): requested at creation, reported back by the device.
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

/// Writes `with_*` builders: each sets one field from its typed value.
macro_rules! builders {
    ($ty:ty { $($(#[$m:meta])* $name:ident($v:ident: $arg:ty) => $field:ident = $conv:expr;)* }) => {
        impl $ty {
            $(
                $(#[$m])*
                #[must_use]
                pub fn $name(mut self, $v: $arg) -> Self {
                    self.$field = $conv;
                    self
                }
            )*
        }
    };
}

impl Default for AhAttr {
    /// All zero: no GRH, port 0 (to be set).
    fn default() -> Self {
        AhAttr::new_zeroed()
    }
}

impl AhAttr {
    /// The global routing header, if `is_global` says there is one.
    pub fn grh(&self) -> Option<GlobalRoute> {
        (self.is_global != 0).then(|| GlobalRoute {
            dgid: Gid(self.dgid),
            flow_label: self.flow_label.get(),
            sgid_index: self.sgid_index,
            hop_limit: self.hop_limit,
            traffic_class: self.traffic_class,
        })
    }

    /// Sets or clears the global routing header; clearing zeroes its fields. The flow label
    /// keeps its field's 20 bits, as a NIC does with a verbs `grh.flow_label` (UCX passes
    /// `~0` for path 0 and relies on that).
    pub fn set_grh(&mut self, grh: Option<GlobalRoute>) {
        let route = grh.unwrap_or_default();
        self.dgid = route.dgid.0;
        self.flow_label = Le32::new(route.flow_label & MAX_FLOW_LABEL);
        self.sgid_index = route.sgid_index;
        self.hop_limit = route.hop_limit;
        self.traffic_class = route.traffic_class;
        self.is_global = u8::from(grh.is_some());
    }

    /// With the global routing header `grh`.
    #[must_use]
    pub fn with_grh(mut self, grh: GlobalRoute) -> Self {
        self.set_grh(Some(grh));
        self
    }
}

builders!(AhAttr {
    /// With destination LID `dlid` (InfiniBand only).
    with_dlid(dlid: u16) => dlid = Le16::new(dlid);
    /// With service level `sl`.
    with_sl(sl: u8) => sl = sl;
    /// With source path bits `bits` (InfiniBand only).
    with_src_path_bits(bits: u8) => src_path_bits = bits;
    /// With static rate `rate` (`ibv_rate`; 0 = port rate).
    with_static_rate(rate: u8) => static_rate = rate;
    /// With local port `port` (1-based).
    with_port_num(port: u8) => port_num = port;
});

impl Default for QpAttr {
    /// All zero (RESET, no flags) except the path MTU, which is [`Mtu::default`]: zero is no
    /// MTU.
    fn default() -> Self {
        let mut attr = QpAttr::new_zeroed();
        attr.path_mtu = Le32::new(Mtu::default() as u32);
        attr
    }
}

impl QpAttr {
    /// The next (MODIFY_QP) or current (QUERY_QP) state.
    pub fn qp_state(&self) -> Result<QpState, UndefinedValue> {
        decode_state("qp_state", self.qp_state.get())
    }

    /// The state the caller expects the QP to be in (with [`QpAttrMask::CUR_STATE`]).
    pub fn cur_qp_state(&self) -> Result<QpState, UndefinedValue> {
        decode_state("cur_qp_state", self.cur_qp_state.get())
    }

    /// The path MTU.
    pub fn path_mtu(&self) -> Result<Mtu, UndefinedValue> {
        let raw = self.path_mtu.get();
        Mtu::try_from(raw).map_err(|_| UndefinedValue {
            field: "path_mtu",
            value: raw.into(),
        })
    }

    /// The remote access allowed on the QP; flags a QP cannot carry count as undefined.
    pub fn qp_access_flags(&self) -> Result<AccessFlags, UndefinedValue> {
        let bits = self.qp_access_flags.get();
        AccessFlags::qp_from_bits(bits).ok_or(UndefinedValue {
            field: "qp_access_flags",
            value: bits.into(),
        })
    }

    /// The queue sizes (`cap`).
    pub fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.max_send_wr.get(),
            max_recv_wr: self.max_recv_wr.get(),
            max_send_sge: self.max_send_sge.get(),
            max_recv_sge: self.max_recv_sge.get(),
            max_inline_data: self.max_inline_data.get(),
        }
    }

    /// Checks that the enumerated fields `valid` selects hold defined values (a QUERY_QP
    /// response); the error names the first that does not. Unselected fields are not looked at.
    pub fn check_defined(&self, valid: QpAttrMask) -> Result<(), UndefinedValue> {
        if valid.contains(QpAttrMask::STATE) {
            self.qp_state()?;
        }
        if valid.contains(QpAttrMask::CUR_STATE) {
            self.cur_qp_state()?;
        }
        if valid.contains(QpAttrMask::PATH_MTU) {
            self.path_mtu()?;
        }
        if valid.contains(QpAttrMask::ACCESS_FLAGS) {
            self.qp_access_flags()?;
        }
        Ok(())
    }
}

fn decode_state(field: &'static str, raw: u32) -> Result<QpState, UndefinedValue> {
    QpState::try_from(raw).map_err(|_| UndefinedValue {
        field,
        value: raw.into(),
    })
}

builders!(QpAttr {
    /// With next state `state`.
    with_qp_state(state: QpState) => qp_state = Le32::new(state as u32);
    /// With expected current state `state` (with [`QpAttrMask::CUR_STATE`]).
    with_cur_qp_state(state: QpState) => cur_qp_state = Le32::new(state as u32);
    /// With path MTU `mtu`.
    with_path_mtu(mtu: Mtu) => path_mtu = Le32::new(mtu as u32);
    /// With path migration state `state` (0 migrated, 1 rearm, 2 armed).
    with_path_mig_state(state: u32) => path_mig_state = Le32::new(state);
    /// With Q_Key `qkey` (UD).
    with_qkey(qkey: u32) => qkey = Le32::new(qkey);
    /// With receive PSN `psn` (24 bits).
    with_rq_psn(psn: u32) => rq_psn = Le32::new(psn);
    /// With send PSN `psn` (24 bits).
    with_sq_psn(psn: u32) => sq_psn = Le32::new(psn);
    /// With remote QP number `qpn` (24 bits).
    with_dest_qp_num(qpn: u32) => dest_qp_num = Le32::new(qpn);
    /// With remote access `flags`.
    with_qp_access_flags(flags: AccessFlags) => qp_access_flags = Le32::new(flags.bits());
    /// With primary path `ah`.
    with_ah_attr(ah: AhAttr) => ah_attr = ah;
    /// With alternate path `ah`.
    with_alt_ah_attr(ah: AhAttr) => alt_ah_attr = ah;
    /// With P_Key index `index`.
    with_pkey_index(index: u16) => pkey_index = Le16::new(index);
    /// With alternate P_Key index `index`.
    with_alt_pkey_index(index: u16) => alt_pkey_index = Le16::new(index);
    /// With an SQ_DRAINED event asked for (or not) when entering SQD.
    with_en_sqd_async_notify(notify: bool) => en_sqd_async_notify = u8::from(notify);
    /// With `n` outstanding RDMA reads/atomics as initiator.
    with_max_rd_atomic(n: u8) => max_rd_atomic = n;
    /// With `n` outstanding RDMA reads/atomics as responder.
    with_max_dest_rd_atomic(n: u8) => max_dest_rd_atomic = n;
    /// With minimum RNR NAK timer `timer` (0..=31).
    with_min_rnr_timer(timer: u8) => min_rnr_timer = timer;
    /// With local port `port`.
    with_port_num(port: u8) => port_num = port;
    /// With local ACK timeout `timeout` (0..=31).
    with_timeout(timeout: u8) => timeout = timeout;
    /// With `n` transport retries (0..=7).
    with_retry_cnt(n: u8) => retry_cnt = n;
    /// With `n` RNR retries (0..=7; 7 = infinite).
    with_rnr_retry(n: u8) => rnr_retry = n;
    /// With alternate port `port`.
    with_alt_port_num(port: u8) => alt_port_num = port;
    /// With alternate path ACK timeout `timeout`.
    with_alt_timeout(timeout: u8) => alt_timeout = timeout;
    /// With rate limit `limit`.
    with_rate_limit(limit: u32) => rate_limit = Le32::new(limit);
});

impl QpAttr {
    /// With queue sizes `caps` (QUERY_QP reports them).
    #[must_use]
    pub fn with_caps(mut self, caps: QpCaps) -> Self {
        self.max_send_wr = Le32::new(caps.max_send_wr);
        self.max_recv_wr = Le32::new(caps.max_recv_wr);
        self.max_send_sge = Le32::new(caps.max_send_sge);
        self.max_recv_sge = Le32::new(caps.max_recv_sge);
        self.max_inline_data = Le32::new(caps.max_inline_data);
        self
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    fn route() -> GlobalRoute {
        GlobalRoute {
            dgid: Gid::from("fe80::1".parse::<Ipv6Addr>().unwrap()),
            flow_label: 0xfffff,
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 3,
        }
    }

    #[test]
    fn a_flow_label_keeps_its_20_bits_and_passes_the_check() {
        let ah = AhAttr::default()
            .with_grh(GlobalRoute {
                flow_label: u32::MAX,
                ..route()
            })
            .with_port_num(1);
        assert_eq!(ah.grh().unwrap().flow_label, MAX_FLOW_LABEL);
        assert!(crate::control::check_ah_attr(&ah).is_ok());
    }

    #[test]
    fn typed_values_round_trip_through_the_wire_fields() {
        let caps = QpCaps {
            max_send_wr: 1,
            max_recv_wr: 2,
            max_send_sge: 3,
            max_recv_sge: 4,
            max_inline_data: 5,
        };
        let ah = AhAttr::default()
            .with_grh(route())
            .with_sl(2)
            .with_port_num(1);
        let attr = QpAttr::default()
            .with_qp_state(QpState::Rtr)
            .with_cur_qp_state(QpState::Init)
            .with_path_mtu(Mtu::Mtu4096)
            .with_qkey(0x1111_1111)
            .with_rq_psn(0xabcdef)
            .with_sq_psn(0x123456)
            .with_dest_qp_num(0x42)
            .with_qp_access_flags(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .with_caps(caps)
            .with_ah_attr(ah)
            .with_pkey_index(1)
            .with_max_rd_atomic(4)
            .with_max_dest_rd_atomic(8)
            .with_min_rnr_timer(12)
            .with_port_num(1)
            .with_timeout(14)
            .with_retry_cnt(7)
            .with_rnr_retry(6);
        assert_eq!(attr.ah_attr.is_global, 1);
        assert_eq!(attr.ah_attr.dgid[..2], [0xfe, 0x80]);
        assert_eq!(attr.path_mtu.get(), 5);
        assert_eq!(attr.check_defined(QpAttrMask::ALL), Ok(()));
        assert_eq!(attr.qp_state(), Ok(QpState::Rtr));
        assert_eq!(attr.cur_qp_state(), Ok(QpState::Init));
        assert_eq!(attr.path_mtu(), Ok(Mtu::Mtu4096));
        assert_eq!(
            attr.qp_access_flags(),
            Ok(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        );
        assert_eq!(attr.caps(), caps);
        assert_eq!(attr.ah_attr.grh(), Some(route()));
        assert_eq!((attr.ah_attr.sl, attr.ah_attr.port_num), (2, 1));
        assert_eq!(
            (attr.qkey.get(), attr.rq_psn.get(), attr.sq_psn.get()),
            (0x1111_1111, 0xabcdef, 0x123456)
        );
        assert_eq!((attr.dest_qp_num.get(), attr.pkey_index.get()), (0x42, 1));
        assert_eq!(
            [
                attr.max_rd_atomic,
                attr.max_dest_rd_atomic,
                attr.min_rnr_timer,
                attr.port_num,
                attr.timeout,
                attr.retry_cnt,
                attr.rnr_retry
            ],
            [4, 8, 12, 1, 14, 7, 6]
        );
    }

    #[test]
    fn undefined_values_from_the_device_are_named() {
        let mut wire = QpAttr {
            qp_state: Le32::new(9),
            ..QpAttr::default()
        };
        assert_eq!(
            wire.check_defined(QpAttrMask::STATE),
            Err(UndefinedValue {
                field: "qp_state",
                value: 9
            })
        );
        // Not selected: not interpreted.
        assert!(wire.check_defined(QpAttrMask::PATH_MTU).is_ok());
        wire.path_mtu = Le32::new(0);
        assert_eq!(wire.path_mtu().unwrap_err().field, "path_mtu");
        wire.cur_qp_state = Le32::new(7);
        assert_eq!(wire.cur_qp_state().unwrap_err().field, "cur_qp_state");
        wire.qp_access_flags = Le32::new(AccessFlags::QP_ALLOWED.bits() | 1 << 30);
        assert_eq!(wire.qp_access_flags().unwrap_err().field, "qp_access_flags");
    }

    #[test]
    fn a_cleared_grh_is_zero_and_not_global() {
        let mut ah = AhAttr::default().with_grh(route());
        assert_eq!(ah.grh(), Some(route()));
        ah.set_grh(None);
        assert_eq!(ah.grh(), None);
        assert_eq!(ah, AhAttr::default());
    }
}

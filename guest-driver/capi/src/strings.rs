//! The helpers every verbs program calls to print and convert values: `ibv_*_str` and the
//! `ibv_rate` conversions. Their results are rdma-core's (44, Debian 12), value for value;
//! `qemu-tests/tests/capi_helpers.rs` compares every input range with the system's
//! `libibverbs.so.1`.

use std::ffi::{c_char, c_int, CStr};

/// What rdma-core answers for a value outside its table.
const UNKNOWN: &CStr = c"unknown";

/// Looks `value` up in a table indexed from `first`; [`UNKNOWN`] outside it.
fn name_of(table: &[&'static CStr], first: i64, value: i64) -> *const c_char {
    usize::try_from(value - first)
        .ok()
        .and_then(|index| table.get(index))
        .copied()
        .unwrap_or(UNKNOWN)
        .as_ptr()
}

/// `enum ibv_node_type` names from IBV_NODE_CA (1) on.
const NODE_TYPES: &[&CStr] = &[
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `enum ibv_port_state` names from IBV_PORT_NOP (0) on.
const PORT_STATES: &[&CStr] = &[
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

/// `enum ibv_event_type` names from IBV_EVENT_CQ_ERR (0) through IBV_EVENT_WQ_FATAL (19).
const EVENT_TYPES: &[&CStr] = &[
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `enum ibv_wc_status` names from IBV_WC_SUCCESS (0) through IBV_WC_TM_RNDV_INCOMPLETE (23).
const WC_STATUSES: &[&CStr] = &[
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `enum ibv_wr_opcode` names from IBV_WR_RDMA_WRITE (0) through IBV_WR_ATOMIC_WRITE (15);
/// 12 and 13 are no opcode (rdma-core 56 hands out its table's empty entries there, NULL).
const WR_OPCODES: &[&CStr] = &[
    c"rdma-write",
    c"rdma-write-with-imm",
    c"send",
    c"send-with-imm",
    c"rdma-read",
    c"atomic-cmp-and-swp",
    c"atomic-fetch-and-add",
    c"local-inv",
    c"bind-mw",
    c"send-with-inv",
    c"tso",
    c"driver1",
    UNKNOWN,
    UNKNOWN,
    c"flush",
    c"atomic-write",
];

/// `ibv_wr_opcode_str` (IBVERBS_PRIVATE_34 in rdma-core 56, which its tools import).
pub extern "C" fn ibv_wr_opcode_str(opcode: u32) -> *const c_char {
    name_of(WR_OPCODES, 0, opcode.into())
}

/// `ibv_node_type_str` (IBVERBS_1.1).
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    name_of(NODE_TYPES, 1, node_type.into())
}

/// `ibv_port_state_str` (IBVERBS_1.1).
pub extern "C" fn ibv_port_state_str(port_state: u32) -> *const c_char {
    name_of(PORT_STATES, 0, port_state.into())
}

/// `ibv_event_type_str` (IBVERBS_1.1).
pub extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
    name_of(EVENT_TYPES, 0, event.into())
}

/// `ibv_wc_status_str` (IBVERBS_1.1).
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    name_of(WC_STATUSES, 0, status.into())
}

/// `IBV_RATE_MAX`: "the port's rate"; what the reverse conversions answer for no match.
const IBV_RATE_MAX: u32 = 0;

/// Every static rate with a defined conversion, as rdma-core converts them: its `enum ibv_rate`
/// value, its multiple of 2.5 Gb/s (0 for the rates that are none: FDR, EDR and HDR lanes), and
/// its data rate in Mb/s.
const RATES: &[(u32, c_int, c_int)] = &[
    (2, 1, 2500),       // 2.5 Gb/s
    (5, 2, 5000),       // 5
    (3, 4, 10000),      // 10
    (6, 8, 20000),      // 20
    (4, 12, 30000),     // 30
    (7, 16, 40000),     // 40
    (8, 24, 60000),     // 60
    (9, 32, 80000),     // 80
    (10, 48, 120000),   // 120
    (11, 0, 14062),     // 14
    (12, 0, 56250),     // 56
    (13, 0, 112500),    // 112
    (14, 0, 168750),    // 168
    (15, 0, 25781),     // 25
    (16, 0, 103125),    // 100
    (17, 0, 206250),    // 200
    (18, 0, 309375),    // 300
    (19, 11, 28125),    // 28
    (20, 20, 53125),    // 50
    (21, 160, 425000),  // 400
    (22, 240, 637500),  // 600
    (23, 320, 850000),  // 800
    (24, 480, 1275000), // 1200
];

fn rate(value: u32) -> Option<(c_int, c_int)> {
    RATES
        .iter()
        .find(|(v, _, _)| *v == value)
        .map(|&(_, mult, mbps)| (mult, mbps))
}

/// `ibv_rate_to_mult` (IBVERBS_1.0): -1 for rates that are not a multiple of 2.5 Gb/s.
pub extern "C" fn ibv_rate_to_mult(value: u32) -> c_int {
    match rate(value) {
        Some((mult, _)) if mult != 0 => mult,
        _ => -1,
    }
}

/// `mult_to_ibv_rate` (IBVERBS_1.0): IBV_RATE_MAX when no rate has that multiple.
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> u32 {
    RATES
        .iter()
        .find(|(_, m, _)| *m != 0 && *m == mult)
        .map_or(IBV_RATE_MAX, |(value, _, _)| *value)
}

/// `ibv_rate_to_mbps` (IBVERBS_1.1): -1 for unknown rates.
pub extern "C" fn ibv_rate_to_mbps(value: u32) -> c_int {
    rate(value).map_or(-1, |(_, mbps)| mbps)
}

/// `mbps_to_ibv_rate` (IBVERBS_1.1): IBV_RATE_MAX when no rate has exactly that speed.
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> u32 {
    RATES
        .iter()
        .find(|(_, _, m)| *m == mbps)
        .map_or(IBV_RATE_MAX, |(value, _, _)| *value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: *const c_char) -> &'static str {
        // SAFETY: every pointer these functions return is one of the 'static C strings above.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn names_and_their_bounds() {
        assert_eq!(text(ibv_wc_status_str(0)), "success");
        assert_eq!(text(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(text(ibv_wc_status_str(21)), "general error");
        assert_eq!(text(ibv_wc_status_str(23)), "TM software rendezvous");
        assert_eq!(text(ibv_wc_status_str(24)), "unknown");
        assert_eq!(text(ibv_event_type_str(15)), "SRQ limit reached");
        assert_eq!(text(ibv_event_type_str(18)), "GID table change");
        assert_eq!(text(ibv_event_type_str(19)), "WQ fatal");
        assert_eq!(text(ibv_event_type_str(20)), "unknown");
        assert_eq!(text(ibv_node_type_str(0)), "unknown");
        assert_eq!(text(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(text(ibv_node_type_str(7)), "unspecified");
        assert_eq!(text(ibv_node_type_str(8)), "unknown");
        assert_eq!(text(ibv_node_type_str(-1)), "unknown");
        assert_eq!(text(ibv_port_state_str(4)), "active");
        assert_eq!(text(ibv_port_state_str(6)), "unknown");
        assert_eq!(text(ibv_wr_opcode_str(0)), "rdma-write");
        assert_eq!(text(ibv_wr_opcode_str(10)), "tso");
        assert_eq!(text(ibv_wr_opcode_str(12)), "unknown");
        assert_eq!(text(ibv_wr_opcode_str(15)), "atomic-write");
        assert_eq!(text(ibv_wr_opcode_str(16)), "unknown");
    }

    #[test]
    fn rates_convert_both_ways() {
        for &(value, mult, _) in RATES {
            assert_eq!(mbps_to_ibv_rate(ibv_rate_to_mbps(value)), value);
            if mult != 0 {
                assert_eq!(mult_to_ibv_rate(ibv_rate_to_mult(value)), value);
            }
        }
        assert_eq!(
            ibv_rate_to_mult(11),
            -1,
            "FDR 14 is no multiple of 2.5 Gb/s"
        );
        assert_eq!(ibv_rate_to_mbps(IBV_RATE_MAX), -1);
        assert_eq!(mult_to_ibv_rate(3), IBV_RATE_MAX);
        assert_eq!(mbps_to_ibv_rate(100_000), IBV_RATE_MAX);
    }
}

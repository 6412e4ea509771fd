//! The address vector of a UD destination (`struct rxe_av`), shared by UD send WQEs and the
//! CREATE_AH response.

use crate::Le32;

wire_struct! {
    /// `struct rxe_av`, 88 bytes (x86-64 layout, including the compiler's padding byte
    /// after `grh.traffic_class`).
    pub struct RxeAv {
        /// Port number.
        pub port_num: u8,
        /// 1 = IPv4, 2 = IPv6.
        pub network_type: u8,
        /// Destination MAC.
        pub dmac: [u8; 6],
        /// `grh.dgid`.
        pub dgid: [u8; 16],
        /// `grh.flow_label`.
        pub flow_label: Le32,
        /// `grh.sgid_index`.
        pub sgid_index: u8,
        /// `grh.hop_limit`.
        pub hop_limit: u8,
        /// `grh.traffic_class`.
        pub traffic_class: u8,
        /// Padding of `struct rxe_global_route`.
        pub pad: u8,
        /// Source address (`sockaddr_in` or `sockaddr_in6`).
        pub sgid_addr: [u8; 28],
        /// Destination address (`sockaddr_in` or `sockaddr_in6`).
        pub dgid_addr: [u8; 28],
    }
}
assert_layout!(RxeAv, 88, port_num @ 0, network_type @ 1, dmac @ 2, dgid @ 8,
    flow_label @ 24, sgid_index @ 28, hop_limit @ 29, traffic_class @ 30, pad @ 31,
    sgid_addr @ 32, dgid_addr @ 60);

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;

    #[test]
    fn av_bytes_follow_the_rxe_layout() {
        let av = RxeAv {
            port_num: 1,
            network_type: 2,
            dmac: [1, 2, 3, 4, 5, 6],
            dgid: [0xfe; 16],
            flow_label: Le32::new(0x0102_0304),
            sgid_index: 7,
            hop_limit: 8,
            traffic_class: 9,
            pad: 0,
            sgid_addr: [0xaa; 28],
            dgid_addr: [0xbb; 28],
        };
        let b = av.as_bytes();
        assert_eq!(&b[..8], &[1, 2, 1, 2, 3, 4, 5, 6]);
        assert_eq!(&b[8..24], &[0xfe; 16]);
        assert_eq!(&b[24..28], &[4, 3, 2, 1]);
        assert_eq!(&b[28..32], &[7, 8, 9, 0]);
        assert_eq!(&b[32..60], &[0xaa; 28]);
        assert_eq!(&b[60..88], &[0xbb; 28]);
    }
}

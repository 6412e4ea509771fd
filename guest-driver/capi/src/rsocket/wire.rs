//! What rsockets put on the wire (rdma-core's stream protocol, version 1): the connection data
//! in the CM REQ/REP private data, the 32-bit messages carried as RDMA WRITE WITH IMM immediates,
//! the scatter entries one side writes into the other's memory, and the one-byte scaled sizes.
//!
//! The layouts are rdma-core's (`librdmacm/rsocket.c`), described in
//! `spec/research/rsockets.md`: connection data and immediates are big-endian; a scatter entry
//! is written in the *receiver's* byte order (the connection data's `NET` flag says which).

/// The only connection-data version there is.
pub(crate) const CONN_DATA_VERSION: u8 = 1;
/// Bytes of connection data in the REQ and the REP.
pub(crate) const CONN_DATA_LEN: usize = 40;
/// Connection-data flag: the sender is big-endian.
pub(crate) const CONN_FLAG_NET: u8 = 1;
/// Connection-data flag: the sender's target buffer has an iomap table after its scatter list.
pub(crate) const CONN_FLAG_IOMAP: u8 = 2;
/// Entries in the scatter list each side lets the other write (`RS_SGL_SIZE`).
pub(crate) const SGL_ENTRIES: u32 = 2;
/// Bytes of one scatter entry in memory.
pub(crate) const SGE_LEN: usize = 16;
/// Send-ring bytes that must be free before a send may go (`RS_SNDLOWAT`).
pub(crate) const SEND_LOW_WATER: u32 = 2048;

/// Wire entry of a buffer: address, key, length (`struct rs_sge`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sge {
    pub(crate) addr: u64,
    pub(crate) key: u32,
    pub(crate) length: u32,
}

impl Sge {
    fn put_be(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.key.to_be_bytes());
        out[12..16].copy_from_slice(&self.length.to_be_bytes());
    }

    fn get_be(b: &[u8]) -> Sge {
        Sge {
            addr: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            key: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            length: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }

    /// The entry as it is RDMA-written into a receiver of `receiver_big_endian` byte order.
    pub(crate) fn to_receiver_bytes(self, receiver_big_endian: bool) -> [u8; SGE_LEN] {
        let mut out = [0u8; SGE_LEN];
        if receiver_big_endian {
            self.put_be(&mut out);
        } else {
            out[0..8].copy_from_slice(&self.addr.to_le_bytes());
            out[8..12].copy_from_slice(&self.key.to_le_bytes());
            out[12..16].copy_from_slice(&self.length.to_le_bytes());
        }
        out
    }
}

/// Whether this host is big-endian (the connection data's `NET` flag).
pub(crate) const fn host_is_big_endian() -> bool {
    cfg!(target_endian = "big")
}

/// Connection data (`struct rs_conn_data`), the same in the request and the reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConnData {
    pub(crate) version: u8,
    pub(crate) flags: u8,
    /// The sender's receive queue depth: how many data writes it can take unread.
    pub(crate) credits: u16,
    /// The sender's iomap table size, scaled ([`value_to_scale`]).
    pub(crate) target_iomap_size: u8,
    /// The sender's scatter list (`length` = number of entries) that the peer writes into.
    pub(crate) target_sgl: Sge,
    /// The first half of the sender's receive ring.
    pub(crate) data_buf: Sge,
}

impl ConnData {
    /// The 40 bytes on the wire.
    pub(crate) fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut out = [0u8; CONN_DATA_LEN];
        out[0] = self.version;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.credits.to_be_bytes());
        out[7] = self.target_iomap_size;
        self.target_sgl.put_be(&mut out[8..24]);
        self.data_buf.put_be(&mut out[24..40]);
        out
    }

    /// Reads connection data; `None` when fewer than 40 bytes came. The version is the
    /// caller's to check.
    pub(crate) fn decode(bytes: &[u8]) -> Option<ConnData> {
        let b = bytes.get(..CONN_DATA_LEN)?;
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: Sge::get_be(&b[8..24]),
            data_buf: Sge::get_be(&b[24..40]),
        })
    }

    /// Whether the sender is big-endian.
    pub(crate) fn sender_big_endian(&self) -> bool {
        self.flags & CONN_FLAG_NET != 0
    }
}

/// Opcode of a 32-bit message (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Bytes written into the receive ring; the low bits are their number.
    Data,
    /// A new credit limit (and, when it carried bytes, a buffer in the scatter list).
    Sgl,
    /// An iomap entry was written; the low bits are its index.
    IomapSgl,
    /// A control message: [`CTRL_DISCONNECT`] or [`CTRL_SHUTDOWN`] (1, keep-alive, travels as a
    /// plain write the receiver never sees).
    Ctrl,
    /// Reserved or local-only opcodes.
    Other(u8),
}

const OP_DATA: u32 = 0;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
const DATA_MASK: u32 = (1 << 29) - 1;

/// The peer closes both directions.
pub(crate) const CTRL_DISCONNECT: u32 = 0;
/// The peer sends no more.
pub(crate) const CTRL_SHUTDOWN: u32 = 2;

/// A message: opcode and 29 bits of data.
pub(crate) fn message(op: Op, data: u32) -> u32 {
    let op = match op {
        Op::Data => OP_DATA,
        Op::Sgl => OP_SGL,
        Op::IomapSgl => OP_IOMAP_SGL,
        Op::Ctrl => OP_CTRL,
        Op::Other(op) => u32::from(op & 7),
    };
    (op << 29) | (data & DATA_MASK)
}

/// The opcode and data of a message.
pub(crate) fn parse_message(msg: u32) -> (Op, u32) {
    let op = match msg >> 29 {
        OP_DATA => Op::Data,
        OP_SGL => Op::Sgl,
        OP_IOMAP_SGL => Op::IomapSgl,
        OP_CTRL => Op::Ctrl,
        other => Op::Other(other as u8),
    };
    (op, msg & DATA_MASK)
}

/// rdma-core's one-byte size encoding: exact up to 128, then multiples of 256.
pub(crate) fn value_to_scale(value: u32, bits: u32) -> u8 {
    let top = 1u32 << (bits - 1);
    if value <= top {
        value as u8
    } else {
        (top | (value >> bits)) as u8
    }
}

/// The size an encoded byte stands for.
pub(crate) fn scale_to_value(scale: u8, bits: u32) -> u32 {
    let top = 1u32 << (bits - 1);
    let scale = u32::from(scale);
    if scale <= top {
        scale
    } else {
        (scale & !top) << bits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_data_has_rdma_cores_layout() {
        let data = ConnData {
            version: 1,
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x1122_3344_5566_7788,
                key: 0xaabb_ccdd,
                length: 2,
            },
            data_buf: Sge {
                addr: 0x1000,
                key: 7,
                length: 65536,
            },
        };
        let b = data.encode();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &0xaabb_ccddu32.to_be_bytes());
        assert_eq!(&b[20..24], &2u32.to_be_bytes());
        assert_eq!(&b[36..40], &65536u32.to_be_bytes());
        assert_eq!(ConnData::decode(&b), Some(data));
        assert_eq!(ConnData::decode(&b[..39]), None);
    }

    #[test]
    fn messages_keep_opcode_and_data_apart() {
        assert_eq!(message(Op::Data, 2048), 2048);
        assert_eq!(message(Op::Sgl, 0x1_0180), 0x8001_0180);
        assert_eq!(message(Op::Ctrl, CTRL_SHUTDOWN), 0xe000_0002);
        assert_eq!(parse_message(0xe000_0000), (Op::Ctrl, CTRL_DISCONNECT));
        assert_eq!(parse_message(0xc000_0003), (Op::IomapSgl, 3));
        assert_eq!(parse_message(0x2000_0001), (Op::Other(1), 1));
        assert_eq!(
            parse_message(message(Op::Data, u32::MAX)),
            (Op::Data, DATA_MASK)
        );
    }

    #[test]
    fn scatter_entries_land_in_the_receivers_order() {
        let sge = Sge {
            addr: 0x0102_0304_0506_0708,
            key: 0x0a0b_0c0d,
            length: 0x10,
        };
        let le = sge.to_receiver_bytes(false);
        assert_eq!(&le[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&le[12..], &0x10u32.to_le_bytes());
        let be = sge.to_receiver_bytes(true);
        assert_eq!(&be[8..12], &0x0a0b_0c0du32.to_be_bytes());
    }

    #[test]
    fn scaled_sizes_round_trip_as_rdma_core_rounds_them() {
        for v in [0, 1, 64, 128] {
            assert_eq!(scale_to_value(value_to_scale(v, 8), 8), v);
        }
        assert_eq!(value_to_scale(512, 8), 0x82);
        assert_eq!(scale_to_value(0x82, 8), 512);
        assert_eq!(scale_to_value(value_to_scale(300, 8), 8), 256);
    }
}

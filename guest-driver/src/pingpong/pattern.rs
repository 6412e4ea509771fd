//! Deterministic data patterns: every message's bytes depend on (operation, size, iteration,
//! direction), so data that is corrupted, misplaced, truncated or left over from an earlier
//! message is found, and the first differing offset is reported.
//!
//! Definition (mirrored byte for byte by the native peer):
//! ```text
//! seed   = (op_id << 56) ^ (direction << 48) ^ (size * 0x9E3779B97F4A7C15) ^ (iter * 0xD1B54A32D192ED03)
//! word j = splitmix64(seed ^ j)                (all arithmetic modulo 2^64)
//! byte k = byte (k mod 8) of word (k div 8), least significant byte first
//! splitmix64(x): z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//!                z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)
//! ```

use std::fmt;

use super::plan::Op;

/// Which way a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ClientToServer = 0,
    ServerToClient = 1,
}

/// Everything a message's contents depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatternKey {
    pub op: Op,
    pub size: u32,
    pub iter: u32,
    pub direction: Direction,
}

impl PatternKey {
    fn seed(&self) -> u64 {
        (u64::from(self.op.pattern_id()) << 56)
            ^ ((self.direction as u64) << 48)
            ^ u64::from(self.size).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ u64::from(self.iter).wrapping_mul(0xD1B5_4A32_D192_ED03)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `key` (its first `buf.len()` bytes).
pub fn fill(key: &PatternKey, buf: &mut [u8]) {
    let seed = key.seed();
    for (j, chunk) in buf.chunks_mut(8).enumerate() {
        let word = splitmix64(seed ^ j as u64).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The first byte of a received message that differs from its pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: usize,
    pub expected: u8,
    pub actual: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "first differing offset {} (expected {:#04x}, found {:#04x})",
            self.offset, self.expected, self.actual
        )
    }
}

/// Checks that `buf` holds the pattern of `key`.
pub fn verify(key: &PatternKey, buf: &[u8]) -> Result<(), Mismatch> {
    let seed = key.seed();
    for (j, chunk) in buf.chunks(8).enumerate() {
        let word = splitmix64(seed ^ j as u64).to_le_bytes();
        if chunk != &word[..chunk.len()] {
            let i = chunk
                .iter()
                .zip(word)
                .position(|(a, e)| *a != e)
                .expect("chunks differ, so one byte does");
            return Err(Mismatch {
                offset: j * 8 + i,
                expected: word[i],
                actual: chunk[i],
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(op: Op, size: u32, iter: u32, direction: Direction) -> PatternKey {
        PatternKey {
            op,
            size,
            iter,
            direction,
        }
    }

    #[test]
    fn known_values_pin_the_definition() {
        // The native peer computes the same bytes; these pin the definition for both.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        let mut buf = [0u8; 10];
        fill(&key(Op::Send, 10, 0, Direction::ClientToServer), &mut buf);
        let seed = (1u64 << 56) ^ 10u64.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let w0 = splitmix64(seed).to_le_bytes();
        let w1 = splitmix64(seed ^ 1).to_le_bytes();
        assert_eq!(&buf[..8], &w0);
        assert_eq!(&buf[8..], &w1[..2]);
        // The same vector is checked by `vrdma-native-pingpong selftest`.
        let mut vector = [0u8; 13];
        fill(
            &key(Op::WriteImm, 13, 7, Direction::ServerToClient),
            &mut vector,
        );
        let hex: String = vector.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "2cc4acbf7b7092b9d10c775836");
    }

    #[test]
    fn finds_every_single_byte_corruption_with_its_offset() {
        let k = key(Op::Write, 4099, 7, Direction::ServerToClient);
        let mut buf = vec![0u8; 4099];
        fill(&k, &mut buf);
        assert_eq!(verify(&k, &buf), Ok(()));
        for offset in [0, 1, 7, 8, 2047, 4096, 4098] {
            let mut bad = buf.clone();
            bad[offset] ^= 0x40;
            assert_eq!(
                verify(&k, &bad),
                Err(Mismatch {
                    offset,
                    expected: buf[offset],
                    actual: buf[offset] ^ 0x40
                })
            );
        }
    }

    #[test]
    fn every_key_component_changes_the_data() {
        let base = key(Op::Send, 64, 3, Direction::ClientToServer);
        let mut data = [0u8; 64];
        fill(&base, &mut data);
        let others = [
            key(Op::SendImm, 64, 3, Direction::ClientToServer),
            key(Op::Send, 65, 3, Direction::ClientToServer),
            key(Op::Send, 64, 4, Direction::ClientToServer),
            key(Op::Send, 64, 3, Direction::ServerToClient),
        ];
        for other in others {
            // Stale data of another iteration, direction, size or operation is refused.
            assert!(verify(&other, &data).is_err(), "{other:?}");
        }
    }

    #[test]
    fn shifted_data_is_refused() {
        let k = key(Op::Read, 256, 1, Direction::ServerToClient);
        let mut data = [0u8; 257];
        fill(&k, &mut data);
        assert!(verify(&k, &data[1..]).is_err());
    }
}

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

/// How a received message differs from its pattern: the first differing byte, and enough
/// about the rest to tell a torn or stale transfer from random corruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: usize,
    pub expected: u8,
    pub actual: u8,
    /// Number of differing bytes.
    pub differing: usize,
    /// Last differing offset.
    pub last_offset: usize,
    /// Every differing byte holds the previous iteration's pattern (a stale message).
    pub previous_iteration: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "first differing offset {} (expected {:#04x}, found {:#04x}); {} bytes differ, the \
             last at offset {}",
            self.offset, self.expected, self.actual, self.differing, self.last_offset
        )?;
        if self.previous_iteration {
            write!(f, "; they hold the previous iteration's data")?;
        }
        Ok(())
    }
}

/// Checks that `buf` holds the pattern of `key`.
pub fn verify(key: &PatternKey, buf: &[u8]) -> Result<(), Mismatch> {
    let mut expected = vec![0u8; buf.len()];
    fill(key, &mut expected);
    let Some(offset) = buf.iter().zip(&expected).position(|(a, e)| a != e) else {
        return Ok(());
    };
    let differing: Vec<usize> = (offset..buf.len())
        .filter(|&i| buf[i] != expected[i])
        .collect();
    let previous_iteration = key.iter > 0 && {
        let mut previous = vec![0u8; buf.len()];
        fill(
            &PatternKey {
                iter: key.iter - 1,
                ..*key
            },
            &mut previous,
        );
        differing.iter().all(|&i| buf[i] == previous[i])
    };
    Err(Mismatch {
        offset,
        expected: expected[offset],
        actual: buf[offset],
        differing: differing.len(),
        last_offset: differing.last().copied().unwrap_or(offset),
        previous_iteration,
    })
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
                    actual: buf[offset] ^ 0x40,
                    differing: 1,
                    last_offset: offset,
                    previous_iteration: false,
                })
            );
        }
    }

    #[test]
    fn a_torn_message_is_told_from_corruption() {
        let k = key(Op::WriteImm, 4096, 96, Direction::ClientToServer);
        let mut buf = vec![0u8; 4096];
        fill(
            &key(Op::WriteImm, 4096, 95, Direction::ClientToServer),
            &mut buf,
        );
        let mut current = vec![0u8; 4096];
        fill(&k, &mut current);
        // The first 2572 bytes arrived, the rest is the previous message.
        buf[..2572].copy_from_slice(&current[..2572]);
        let m = verify(&k, &buf).unwrap_err();
        assert!(m.offset >= 2572 && m.previous_iteration, "{m}");
        assert_eq!(m.last_offset, 4095);
        assert!(m.to_string().contains("previous iteration"));
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

//! The parsing of the values a guest's settings and identity are written in, shared by the
//! command line and the configuration file.

use crate::identity::{GuestAddress, IpPrefix};

/// Parses a byte count with an optional binary suffix (K, M, G).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|e| format!("{text:?} is not a byte count: {e}"))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses every address of a list, naming the bad one.
pub fn parse_addresses<S: AsRef<str>>(texts: &[S]) -> Result<Vec<GuestAddress>, String> {
    texts
        .iter()
        .map(|t| t.as_ref().parse().map_err(|e| format!("address: {e}")))
        .collect()
}

/// Parses every destination prefix of a list, naming the bad one.
pub fn parse_prefixes<S: AsRef<str>>(texts: &[S]) -> Result<Vec<IpPrefix>, String> {
    texts
        .iter()
        .map(|t| {
            t.as_ref()
                .parse()
                .map_err(|e| format!("destination prefix: {e}"))
        })
        .collect()
}

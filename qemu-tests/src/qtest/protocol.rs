//! The qtest protocol's line format: replies, numbers, hex data, and the asynchronous IRQ lines
//! with the interrupt state they update.

use super::error::{QtestError, Result};

/// Interrupt lines QEMU's qtest server reports (its `MAX_IRQ`).
pub const MAX_IRQ: usize = 256;

/// Interrupt lines as QEMU last reported them.
#[derive(Debug, Clone)]
pub struct IrqState {
    /// Level of each line.
    pub high: [bool; MAX_IRQ],
    /// "IRQ raise" lines seen since the connection opened.
    pub raises: u64,
}

impl Default for IrqState {
    fn default() -> Self {
        IrqState {
            high: [false; MAX_IRQ],
            raises: 0,
        }
    }
}

impl IrqState {
    /// Whether any line is high.
    pub fn any_high(&self) -> bool {
        self.high.iter().any(|&h| h)
    }
}

/// One asynchronous IRQ line: (raised, line number).
pub(super) fn parse_irq(line: &str) -> Option<(bool, usize)> {
    let rest = line.strip_prefix("IRQ ")?;
    let (what, num) = rest.split_once(' ')?;
    let raised = match what {
        "raise" => true,
        "lower" => false,
        _ => return None,
    };
    let num: usize = num.trim().parse().ok()?;
    (num < MAX_IRQ).then_some((raised, num))
}

/// Updates `state` with one IRQ line.
pub(super) fn apply_irq(state: &mut IrqState, (raised, num): (bool, usize)) {
    state.high[num] = raised;
    if raised {
        state.raises += 1;
    }
}

/// What follows `OK` in a reply, or the failure.
pub(super) fn parse_reply(command: &str, reply: &str) -> Result<String> {
    if reply == "OK" {
        return Ok(String::new());
    }
    if let Some(rest) = reply.strip_prefix("OK ") {
        return Ok(rest.trim().to_string());
    }
    Err(QtestError::Failed {
        command: short(command),
        reply: reply.to_string(),
    })
}

/// A number as QEMU prints it (`0x…` hex or decimal).
pub(super) fn parse_number(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Appends `data` as lowercase hex digits to `out`.
pub(super) fn encode_hex(data: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(data.len() * 2);
    for &byte in data {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
}

/// Decodes `0x<hex>` of exactly `out.len()` bytes.
pub(super) fn decode_hex(text: &str, out: &mut [u8]) -> Option<()> {
    let hex = text.strip_prefix("0x")?.as_bytes();
    if hex.len() != out.len() * 2 {
        return None;
    }
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let nibble = |c: u8| (c as char).to_digit(16);
        *byte = u8::try_from(nibble(pair[0])? << 4 | nibble(pair[1])?).ok()?;
    }
    Some(())
}

/// A command shortened for messages (data writes can be long).
pub(super) fn short(command: &str) -> String {
    const MAX: usize = 80;
    if command.len() <= MAX {
        command.to_string()
    } else {
        let mut cut = MAX;
        while !command.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}… ({} bytes)", &command[..cut], command.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked() {
        assert_eq!(parse_reply("outl", "OK").unwrap(), "");
        assert_eq!(parse_reply("readl", "OK 0x0000001f").unwrap(), "0x0000001f");
        let err = parse_reply("irq_intercept_in x", "FAIL Unknown device").unwrap_err();
        assert!(err.to_string().contains("Unknown device"), "{err}");
        assert!(parse_reply("write", "ERR invalid argument size").is_err());
        assert!(parse_reply("x", "OKAY").is_err());
    }

    #[test]
    fn numbers_parse_as_qemu_prints_them() {
        assert_eq!(parse_number("0x00000000000000ab"), Some(0xab));
        assert_eq!(parse_number("0xffff"), Some(0xffff));
        assert_eq!(parse_number("42"), Some(42));
        assert_eq!(parse_number("0xzz"), None);
        assert_eq!(parse_number(""), None);
    }

    #[test]
    fn irq_lines_are_recognised() {
        assert_eq!(parse_irq("IRQ raise 16"), Some((true, 16)));
        assert_eq!(parse_irq("IRQ lower 0"), Some((false, 0)));
        assert_eq!(parse_irq("IRQ raise 256"), None);
        assert_eq!(parse_irq("IRQ blink 3"), None);
        assert_eq!(parse_irq("OK 0x1"), None);
        let mut state = IrqState::default();
        apply_irq(&mut state, (true, 17));
        assert!(state.any_high() && state.raises == 1);
        apply_irq(&mut state, (false, 17));
        assert!(!state.any_high() && state.raises == 1);
    }

    #[test]
    fn hex_round_trips() {
        let data: Vec<u8> = (0..=255).collect();
        let mut text = String::from("0x");
        encode_hex(&data, &mut text);
        assert!(text.starts_with("0x000102"));
        let mut back = vec![0u8; data.len()];
        decode_hex(&text, &mut back).unwrap();
        assert_eq!(back, data);
        // Uppercase digits are accepted; wrong lengths and non-hex are not.
        let mut two = [0u8; 2];
        decode_hex("0xABcd", &mut two).unwrap();
        assert_eq!(two, [0xab, 0xcd]);
        assert!(decode_hex("0xabc", &mut two).is_none());
        assert!(decode_hex("abcd", &mut two).is_none());
        assert!(decode_hex("0xabzz", &mut two).is_none());
    }

    #[test]
    fn long_commands_are_shortened_in_messages() {
        let long = format!("write 0x1000 0x100 0x{}", "ab".repeat(256));
        let s = short(&long);
        assert!(s.len() < 120 && s.contains("bytes"), "{s}");
        assert_eq!(short("inl 0xcfc"), "inl 0xcfc");
    }
}

//! The out-of-band lines the two sides exchange over TCP (format in [`crate::pingpong`]).

use std::fmt::Write as _;

use super::plan::{parse_decimal, Plan, PlanError};

/// First word of every line: the protocol and its version.
pub const MAGIC: &str = "VRDMA-PP/1";
/// Longest line a side accepts, newline included.
pub const MAX_LINE: usize = 1024;

/// What one side tells the other about itself before any RDMA traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// RC queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number of the RC send queue (24 bits).
    pub psn: u32,
    /// GID of port 1, index 0, in network byte order.
    pub gid: [u8; 16],
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Address (in the memory region's iova space) of the area the peer writes and reads.
    pub addr: u64,
    /// Length of that area in bytes.
    pub len: u64,
    /// The plan: the client's own; the server echoes the plan it accepted.
    pub plan: Plan,
    /// UD queue pair number, present exactly when the plan has `ud_send`.
    pub ud_qpn: Option<u32>,
}

/// One out-of-band line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    /// Queue pairs are ready to send and every receive is posted.
    Ready,
    /// The plan ran to the end on this side and all its work requests completed.
    Done,
    /// One-way mode: the server verified the client's latest message.
    Ack,
    /// This side gives up (a refused plan or a failure); it closes the connection next.
    Error(String),
}

/// Why a line was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    #[error("line does not start with {MAGIC:?}: {0:?}")]
    NotOurProtocol(String),
    #[error("expected field {expected:?}, found {found:?}")]
    UnexpectedField {
        expected: &'static str,
        found: String,
    },
    #[error("field {field}: {value:?} is not valid ({why})")]
    BadValue {
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("unexpected trailing text {0:?}")]
    Trailing(String),
    #[error("plan: {0}")]
    Plan(#[from] PlanError),
    #[error("udqpn must be present exactly when the plan has ud_send")]
    UdQpnMismatch,
    #[error("line is longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("line is not printable ASCII")]
    NotAscii,
}

impl Message {
    /// The line for this message, newline included.
    pub fn to_line(&self) -> String {
        let mut line = String::from(MAGIC);
        match self {
            Message::Hello(h) => {
                let _ = write!(
                    line,
                    " qpn={:x} psn={:x} gid={} rkey={:x} addr={:x} len={} plan={}",
                    h.qpn,
                    h.psn,
                    hex(&h.gid),
                    h.rkey,
                    h.addr,
                    h.len,
                    h.plan.to_wire()
                );
                if let Some(ud_qpn) = h.ud_qpn {
                    let _ = write!(line, " udqpn={ud_qpn:x}");
                }
            }
            Message::Ready => line.push_str(" ready"),
            Message::Done => line.push_str(" done"),
            Message::Ack => line.push_str(" ack"),
            Message::Error(text) => {
                line.push_str(" error ");
                // One line of printable ASCII, whatever the message held.
                line.extend(
                    text.chars()
                        .map(|c| {
                            if c == ' ' || c.is_ascii_graphic() {
                                c
                            } else {
                                '?'
                            }
                        })
                        .take(MAX_LINE - MAGIC.len() - 8),
                );
            }
        }
        line.push('\n');
        line
    }

    /// Parses one line (with or without its newline).
    pub fn parse(line: &str) -> Result<Message, ExchangeError> {
        if line.len() > MAX_LINE {
            return Err(ExchangeError::TooLong);
        }
        let line = line.strip_suffix('\n').unwrap_or(line);
        if !line.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
            return Err(ExchangeError::NotAscii);
        }
        let rest = line
            .strip_prefix(MAGIC)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or_else(|| ExchangeError::NotOurProtocol(line.to_string()))?;
        match rest {
            "ready" => return Ok(Message::Ready),
            "done" => return Ok(Message::Done),
            "ack" => return Ok(Message::Ack),
            _ => {}
        }
        if let Some(text) = rest.strip_prefix("error ") {
            return Ok(Message::Error(text.to_string()));
        }
        parse_hello(rest).map(Message::Hello)
    }
}

fn parse_hello(text: &str) -> Result<Hello, ExchangeError> {
    let mut fields = text.split(' ');
    let mut next = |name: &'static str| -> Result<&str, ExchangeError> {
        let field = fields.next().unwrap_or("");
        field
            .strip_prefix(name)
            .and_then(|f| f.strip_prefix('='))
            .ok_or_else(|| ExchangeError::UnexpectedField {
                expected: name,
                found: field.to_string(),
            })
    };
    let qpn = parse_hex("qpn", next("qpn")?, 0xff_ffff)? as u32;
    let psn = parse_hex("psn", next("psn")?, 0xff_ffff)? as u32;
    let gid = parse_gid(next("gid")?)?;
    let rkey = parse_hex("rkey", next("rkey")?, u64::from(u32::MAX))? as u32;
    let addr = parse_hex("addr", next("addr")?, u64::MAX)?;
    let len_text = next("len")?;
    let len = parse_decimal(len_text)
        .filter(|len| *len > 0)
        .ok_or_else(|| bad("len", len_text, "a decimal number of bytes, 1 or more"))?;
    if addr.checked_add(len).is_none() {
        return Err(bad(
            "len",
            len_text,
            "the area wraps around the address space",
        ));
    }
    let plan = Plan::from_wire(next("plan")?)?;
    let ud_qpn = match fields.next() {
        None => None,
        Some(field) => {
            let value = field
                .strip_prefix("udqpn=")
                .ok_or_else(|| ExchangeError::Trailing(field.to_string()))?;
            Some(parse_hex("udqpn", value, 0xff_ffff)? as u32)
        }
    };
    if let Some(extra) = fields.next() {
        return Err(ExchangeError::Trailing(extra.to_string()));
    }
    if ud_qpn.is_some() != plan.uses_ud() {
        return Err(ExchangeError::UdQpnMismatch);
    }
    Ok(Hello {
        qpn,
        psn,
        gid,
        rkey,
        addr,
        len,
        plan,
        ud_qpn,
    })
}

fn bad(field: &'static str, value: &str, why: &'static str) -> ExchangeError {
    ExchangeError::BadValue {
        field,
        value: value.to_string(),
        why,
    }
}

/// Hexadecimal without prefix, 1 to 16 digits, at most `max`.
fn parse_hex(field: &'static str, value: &str, max: u64) -> Result<u64, ExchangeError> {
    if value.is_empty() || value.len() > 16 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(field, value, "hexadecimal digits without prefix"));
    }
    u64::from_str_radix(value, 16)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| bad(field, value, "out of range"))
}

fn parse_gid(value: &str) -> Result<[u8; 16], ExchangeError> {
    if value.len() != 32 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("gid", value, "exactly 32 hexadecimal digits"));
    }
    let mut gid = [0u8; 16];
    for (i, byte) in gid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&value[2 * i..2 * i + 2], 16)
            .map_err(|_| bad("gid", value, "exactly 32 hexadecimal digits"))?;
    }
    Ok(gid)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(plan: &str, ud_qpn: Option<u32>) -> Hello {
        Hello {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
            ],
            rkey: 0x1234,
            addr: 0x7f00_dead_0000,
            len: 1 << 20,
            plan: Plan::from_wire(plan).unwrap(),
            ud_qpn,
        }
    }

    #[test]
    fn hello_line_has_the_documented_form_and_round_trips() {
        let h = hello("send,read:1,4096:100:verify", None);
        let line = Message::Hello(h.clone()).to_line();
        assert_eq!(
            line,
            "VRDMA-PP/1 qpn=11 psn=abcdef gid=fe80000000000000021122fffe334455 rkey=1234 \
             addr=7f00dead0000 len=1048576 plan=send,read:1,4096:100:verify\n"
        );
        assert_eq!(Message::parse(&line), Ok(Message::Hello(h)));
        let ud = hello("ud_send:64:10:verify", Some(0x12));
        let line = Message::Hello(ud.clone()).to_line();
        assert!(line.ends_with(" udqpn=12\n"), "{line}");
        assert_eq!(Message::parse(&line), Ok(Message::Hello(ud)));
        // Upper-case hex is accepted.
        let upper = "VRDMA-PP/1 qpn=1A psn=0 gid=FE80000000000000021122FFFE334455 rkey=FF \
                     addr=0 len=1 plan=send:1:1:verify";
        assert!(matches!(Message::parse(upper), Ok(Message::Hello(h)) if h.qpn == 0x1a));
    }

    #[test]
    fn control_lines_round_trip() {
        for m in [
            Message::Ready,
            Message::Done,
            Message::Ack,
            Message::Error("size 2097152 above buffer".into()),
        ] {
            assert_eq!(Message::parse(&m.to_line()), Ok(m));
        }
        let sanitized = Message::Error("two\nlines\té".into()).to_line();
        assert_eq!(sanitized, "VRDMA-PP/1 error two?lines??\n");
    }

    #[test]
    fn rejects_garbage() {
        let good = Message::Hello(hello("send:1:1:verify", None)).to_line();
        let mutations: Vec<String> = vec![
            String::new(),
            "hello\n".into(),
            good.replace("VRDMA-PP/1", "VRDMA-PP/2"),
            good.replace("qpn=11", "qpn=1000000"),
            good.replace("qpn=11", "qpn=0x11"),
            good.replace("qpn=11", "qpn="),
            good.replace("psn=abcdef", "psn=-1"),
            good.replace("gid=fe80", "gid=fe8"),
            good.replace("gid=fe80", "gid=fg80"),
            good.replace("rkey=1234", "rkey=100000000"),
            good.replace("len=1048576", "len=0"),
            good.replace("len=1048576", "len=0x10"),
            good.replace("addr=7f00dead0000", "addr=ffffffffffffffff"),
            good.replace(" plan=send:1:1:verify", " plan=send:1:1"),
            good.replace(" rkey=1234", ""),
            good.replace("qpn=11 psn=abcdef", "psn=abcdef qpn=11"),
            good.replace("  ", " ").replace(" psn", "  psn"),
            good.replace('\n', " extra=1\n"),
            good.replace('\n', " udqpn=5\n"),
            good.replace("len", "\u{7f}len"),
            format!("{}{}", good.trim_end(), "x".repeat(MAX_LINE)),
        ];
        for line in mutations {
            assert!(Message::parse(&line).is_err(), "accepted {line:?}");
        }
        let ud_without_qpn = Message::Hello(hello("ud_send:1:1:verify", None)).to_line();
        assert_eq!(
            Message::parse(&ud_without_qpn),
            Err(ExchangeError::UdQpnMismatch)
        );
    }
}

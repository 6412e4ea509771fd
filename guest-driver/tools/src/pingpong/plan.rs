//! The test plan: which operations, at which sizes, how many times, in which mode.
//!
//! Both sides run [`Plan::steps`] in the same order; the client's plan travels in its hello
//! line ([`Plan::to_wire`]) and is authoritative.

use std::fmt;

use serde::Serialize;

/// Largest message size a plan may ask for (1 MiB).
pub const MAX_SIZE: u32 = 1 << 20;
/// Path MTU both sides configure; also the largest UD message.
pub const MTU: u32 = 1024;
/// Bytes of Global Route Header that a UD receive finds before the payload.
pub const GRH_LEN: u32 = 40;
/// The source address a UD receive's GRH names, as a GID. For RoCE v2 the GRH is the packet's
/// IP header: an IPv6 header (source at bytes 8..24), or an IPv4 header in its last 20 bytes
/// (source at 32..36, returned IPv4-mapped), as rxe writes it (`rxe_resp.c`).
pub fn grh_source_gid(grh: &[u8]) -> Option<[u8; 16]> {
    let grh = grh.get(..GRH_LEN as usize)?;
    let mut gid = [0u8; 16];
    match grh[0] >> 4 {
        6 => gid.copy_from_slice(&grh[8..24]),
        _ if grh[20] >> 4 == 4 => {
            gid[10..12].copy_from_slice(&[0xff, 0xff]);
            gid[12..].copy_from_slice(&grh[32..36]);
        }
        _ => return None,
    }
    Some(gid)
}

/// Largest number of outstanding messages in bandwidth mode.
pub const MAX_WINDOW: u32 = 128;
/// Largest iteration count of one step.
pub const MAX_ITERS: u32 = 10_000_000;
/// Largest number of sizes in one plan (keeps the hello line short).
pub const MAX_SIZES: usize = 32;

/// One kind of exchange between the two sides (see the module documentation of
/// [`crate::pingpong`] for what each does on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    UdSend,
}

impl Op {
    /// Every operation, in the order of their pattern identifiers.
    pub const ALL: [Op; 6] = [
        Op::Send,
        Op::SendImm,
        Op::Write,
        Op::WriteImm,
        Op::Read,
        Op::UdSend,
    ];

    /// The name used on the command line and in the hello line.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::SendImm => "send_imm",
            Op::Write => "write",
            Op::WriteImm => "write_imm",
            Op::Read => "read",
            Op::UdSend => "ud_send",
        }
    }

    /// The operation called `name`.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The number that seeds this operation's data patterns (1..=6).
    pub const fn pattern_id(self) -> u8 {
        match self {
            Op::Send => 1,
            Op::SendImm => 2,
            Op::Write => 3,
            Op::WriteImm => 4,
            Op::Read => 5,
            Op::UdSend => 6,
        }
    }

    /// Whether bandwidth mode can stream this operation.
    pub const fn streams(self) -> bool {
        matches!(self, Op::Send | Op::Write)
    }

    /// Whether the client alone can move this operation's payload (everything but `read`).
    pub const fn one_way(self) -> bool {
        !matches!(self, Op::Read)
    }

    /// Largest message of this operation: UD messages fit in one MTU.
    pub const fn max_size(self) -> u32 {
        match self {
            Op::UdSend => MTU,
            _ => MAX_SIZE,
        }
    }

    /// Bytes of the receive area a message of `size` occupies (UD adds the GRH).
    pub const fn area_bytes(self, size: u32) -> u64 {
        match self {
            Op::UdSend => size as u64 + GRH_LEN as u64,
            _ => size as u64,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How each step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Ping-pong round trips, every byte verified.
    Verify,
    /// The client streams messages with up to `window` outstanding; the last one is verified.
    Bandwidth { window: u32 },
    /// The client's messages only, each verified and acknowledged over TCP: the server posts
    /// no send at all (so its data path works with its backend stopped).
    Oneway,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Verify => f.write_str("verify"),
            Mode::Bandwidth { window } => write!(f, "bw{window}"),
            Mode::Oneway => f.write_str("oneway"),
        }
    }
}

/// One (operation, size) pair of a plan, run `iters` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub size: u32,
}

/// Why a plan is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown operation {0:?} (known: send, send_imm, write, write_imm, read, ud_send)")]
    UnknownOp(String),
    #[error("operation {0} listed twice")]
    DuplicateOp(Op),
    #[error("no operation given")]
    NoOps,
    #[error("size {0:?} is not a decimal number of bytes")]
    BadSize(String),
    #[error("size {0} is outside 1..={MAX_SIZE}")]
    SizeOutOfRange(u64),
    #[error("size {0} listed twice")]
    DuplicateSize(u32),
    #[error("{0} sizes given, at most {MAX_SIZES} allowed")]
    TooManySizes(usize),
    #[error("no size given")]
    NoSizes,
    #[error("iteration count {0:?} is not a number in 1..={MAX_ITERS}")]
    BadIters(String),
    #[error(
        "mode {0:?} is not \"verify\", \"oneway\" or \"bw<window>\" with a window in 1..={MAX_WINDOW}"
    )]
    BadMode(String),
    #[error("bandwidth mode streams only send and write, not {0}")]
    NotStreamable(Op),
    #[error("one-way mode cannot run {0}")]
    NotOneWay(Op),
    #[error("no step left: ud_send runs only sizes up to {MTU}")]
    NoSteps,
    #[error("plan {0:?} is not <ops>:<sizes>:<iters>:<mode>")]
    BadShape(String),
}

/// A validated test plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    ops: Vec<Op>,
    sizes: Vec<u32>,
    iters: u32,
    mode: Mode,
}

impl Plan {
    /// A plan, if it is valid: distinct operations and sizes, sizes in `1..=MAX_SIZE`, iterations
    /// in `1..=MAX_ITERS`, only streamable operations in bandwidth mode, at least one step.
    pub fn new(ops: Vec<Op>, sizes: Vec<u32>, iters: u32, mode: Mode) -> Result<Plan, PlanError> {
        if ops.is_empty() {
            return Err(PlanError::NoOps);
        }
        for (i, op) in ops.iter().enumerate() {
            if ops[..i].contains(op) {
                return Err(PlanError::DuplicateOp(*op));
            }
            if matches!(mode, Mode::Bandwidth { .. }) && !op.streams() {
                return Err(PlanError::NotStreamable(*op));
            }
            if mode == Mode::Oneway && !op.one_way() {
                return Err(PlanError::NotOneWay(*op));
            }
        }
        if sizes.is_empty() {
            return Err(PlanError::NoSizes);
        }
        if sizes.len() > MAX_SIZES {
            return Err(PlanError::TooManySizes(sizes.len()));
        }
        for (i, size) in sizes.iter().enumerate() {
            if *size == 0 || *size > MAX_SIZE {
                return Err(PlanError::SizeOutOfRange(u64::from(*size)));
            }
            if sizes[..i].contains(size) {
                return Err(PlanError::DuplicateSize(*size));
            }
        }
        if iters == 0 || iters > MAX_ITERS {
            return Err(PlanError::BadIters(iters.to_string()));
        }
        if let Mode::Bandwidth { window } = mode {
            if window == 0 || window > MAX_WINDOW {
                return Err(PlanError::BadMode(mode.to_string()));
            }
        }
        let plan = Plan {
            ops,
            sizes,
            iters,
            mode,
        };
        if plan.steps().next().is_none() {
            return Err(PlanError::NoSteps);
        }
        Ok(plan)
    }

    /// Parses the pieces of a plan as the command line gives them.
    pub fn from_parts(ops: &str, sizes: &str, iters: &str, mode: &str) -> Result<Plan, PlanError> {
        Plan::new(
            parse_ops(ops)?,
            parse_sizes(sizes)?,
            parse_iters(iters)?,
            parse_mode(mode)?,
        )
    }

    /// Parses the `plan=` value of a hello line: `<ops>:<sizes>:<iters>:<mode>`.
    pub fn from_wire(text: &str) -> Result<Plan, PlanError> {
        let parts: Vec<&str> = text.split(':').collect();
        let [ops, sizes, iters, mode] = parts[..] else {
            return Err(PlanError::BadShape(text.to_string()));
        };
        Plan::from_parts(ops, sizes, iters, mode)
    }

    /// The `plan=` value of a hello line.
    pub fn to_wire(&self) -> String {
        let ops: Vec<&str> = self.ops.iter().map(|op| op.name()).collect();
        let sizes: Vec<String> = self.sizes.iter().map(u32::to_string).collect();
        format!(
            "{}:{}:{}:{}",
            ops.join(","),
            sizes.join(","),
            self.iters,
            self.mode
        )
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn sizes(&self) -> &[u32] {
        &self.sizes
    }

    pub fn iters(&self) -> u32 {
        self.iters
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether a UD queue pair is needed.
    pub fn uses_ud(&self) -> bool {
        self.ops.contains(&Op::UdSend)
    }

    /// The steps in the order both sides run them: operation-major, sizes in the given order,
    /// `ud_send` skipping sizes above the MTU.
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        self.ops.iter().flat_map(move |&op| {
            self.sizes
                .iter()
                .filter(move |&&size| size <= op.max_size())
                .map(move |&size| Step { op, size })
        })
    }

    /// Bytes the receive area of each side must hold to run this plan.
    pub fn area_len(&self) -> u64 {
        self.steps()
            .map(|s| s.op.area_bytes(s.size))
            .max()
            .unwrap_or(0)
    }
}

/// Parses a comma-separated list of operation names.
pub fn parse_ops(text: &str) -> Result<Vec<Op>, PlanError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|name| Op::from_name(name).ok_or_else(|| PlanError::UnknownOp(name.to_string())))
        .collect()
}

/// Parses a comma-separated list of decimal sizes in bytes.
pub fn parse_sizes(text: &str) -> Result<Vec<u32>, PlanError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|size| {
            let value = parse_decimal(size).ok_or_else(|| PlanError::BadSize(size.to_string()))?;
            u32::try_from(value)
                .ok()
                .filter(|v| (1..=MAX_SIZE).contains(v))
                .ok_or(PlanError::SizeOutOfRange(value))
        })
        .collect()
}

fn parse_iters(text: &str) -> Result<u32, PlanError> {
    parse_decimal(text)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| (1..=MAX_ITERS).contains(v))
        .ok_or_else(|| PlanError::BadIters(text.to_string()))
}

fn parse_mode(text: &str) -> Result<Mode, PlanError> {
    match text {
        "verify" => return Ok(Mode::Verify),
        "oneway" => return Ok(Mode::Oneway),
        _ => {}
    }
    text.strip_prefix("bw")
        .and_then(parse_decimal)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| (1..=MAX_WINDOW).contains(v))
        .map(|window| Mode::Bandwidth { window })
        .ok_or_else(|| PlanError::BadMode(text.to_string()))
}

/// A plain decimal number: digits only (no sign, no spaces), at most 10 of them.
pub(crate) fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_round_trips() {
        let plan =
            Plan::from_parts("send,write_imm,ud_send", "1,64,4096", "300", "verify").unwrap();
        assert_eq!(
            plan.to_wire(),
            "send,write_imm,ud_send:1,64,4096:300:verify"
        );
        assert_eq!(Plan::from_wire(&plan.to_wire()).unwrap(), plan);
        let bw = Plan::from_parts("write,send", "65536", "1000", "bw16").unwrap();
        assert_eq!(bw.mode(), Mode::Bandwidth { window: 16 });
        assert_eq!(Plan::from_wire("write,send:65536:1000:bw16").unwrap(), bw);
        let oneway = Plan::from_wire("write,send_imm,ud_send:64:50:oneway").unwrap();
        assert_eq!(oneway.mode(), Mode::Oneway);
        assert_eq!(oneway.to_wire(), "write,send_imm,ud_send:64:50:oneway");
    }

    #[test]
    fn steps_are_op_major_and_ud_skips_sizes_above_the_mtu() {
        let plan = Plan::from_parts("read,ud_send", "64,1048576,1024", "1", "verify").unwrap();
        let steps: Vec<(Op, u32)> = plan.steps().map(|s| (s.op, s.size)).collect();
        assert_eq!(
            steps,
            [
                (Op::Read, 64),
                (Op::Read, 1 << 20),
                (Op::Read, 1024),
                (Op::UdSend, 64),
                (Op::UdSend, 1024)
            ]
        );
        assert_eq!(plan.area_len(), 1 << 20);
        let ud_only = Plan::from_parts("ud_send", "1024", "1", "verify").unwrap();
        assert_eq!(ud_only.area_len(), 1024 + 40);
        assert_eq!(
            Plan::from_parts("ud_send", "2048", "1", "verify"),
            Err(PlanError::NoSteps)
        );
    }

    #[test]
    fn rejects_bad_plans() {
        let bad = [
            ("sned", "1", "1", "verify"),
            ("send,send", "1", "1", "verify"),
            ("", "1", "1", "verify"),
            ("send", "0", "1", "verify"),
            ("send", "1048577", "1", "verify"),
            ("send", "1,1", "1", "verify"),
            ("send", "", "1", "verify"),
            ("send", "-1", "1", "verify"),
            ("send", "1k", "1", "verify"),
            ("send", "99999999999", "1", "verify"),
            ("send", "1", "0", "verify"),
            ("send", "1", "+5", "verify"),
            ("send", "1", "10000001", "verify"),
            ("send,", "1", "1", "verify"),
            ("send", "1,,2", "1", "verify"),
            ("send", "1", "1", "fast"),
            ("send", "1", "1", "bw0"),
            ("send", "1", "1", "bw129"),
            ("read", "1", "1", "bw4"),
            ("send,read", "1", "1", "oneway"),
        ];
        for (ops, sizes, iters, mode) in bad {
            assert!(
                Plan::from_parts(ops, sizes, iters, mode).is_err(),
                "{ops}:{sizes}:{iters}:{mode} accepted"
            );
        }
        let many: Vec<String> = (1..=33).map(|s| s.to_string()).collect();
        assert_eq!(
            Plan::from_parts("send", &many.join(","), "1", "verify"),
            Err(PlanError::TooManySizes(33))
        );
        for wire in ["send:1:1", "send:1:1:verify:x", "", "send 1 1 verify"] {
            assert!(Plan::from_wire(wire).is_err(), "{wire:?} accepted");
        }
    }

    #[test]
    fn op_names_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::from_name(op.name()), Some(op));
        }
        let ids: Vec<u8> = Op::ALL.iter().map(|op| op.pattern_id()).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn the_grh_source_is_read_from_the_ip_header_it_holds() {
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb, 0, 1]);
        assert_eq!(grh_source_gid(&v6).unwrap(), v6[8..24]);
        let mut v4 = [0u8; 40];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[127, 0, 0, 2]);
        let mut mapped = [0u8; 16];
        mapped[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 2]);
        assert_eq!(grh_source_gid(&v4).unwrap(), mapped);
        assert_eq!(grh_source_gid(&[0u8; 40]), None);
        assert_eq!(grh_source_gid(&v6[..39]), None);
    }
}

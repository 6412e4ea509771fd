//! rsocket defaults and the files that override them, as rdma-core reads them: one integer per
//! file in `/etc/rdma/rsocket/`, read once, at the first `rsocket()`.

use std::sync::OnceLock;
use std::time::Duration;

use super::wire::{scale_to_value, value_to_scale, SEND_LOW_WATER};

/// Where rdma-core's rsockets read their configuration (`RS_CONF_DIR`).
const CONF_DIR: &str = "/etc/rdma/rsocket";

/// Smallest and largest queue depth an rsocket asks for (`RS_QP_MIN_SIZE`, `RS_QP_MAX_SIZE`).
pub(crate) const QP_MIN_SIZE: u32 = 16;
pub(crate) const QP_MAX_SIZE: u32 = 0xfffe;

/// Process-wide defaults of new rsockets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    /// Busy-polling before a blocking wait.
    pub(crate) polling_time: Duration,
    /// Longest single sleep of `rpoll` before it looks at every socket again.
    pub(crate) wake_up_interval: Duration,
    pub(crate) inline: u32,
    pub(crate) sq_size: u32,
    pub(crate) rq_size: u32,
    /// Receive ring bytes.
    pub(crate) mem: u32,
    /// Send ring bytes.
    pub(crate) wmem: u32,
    /// iomap entries (scale-rounded).
    pub(crate) iomap_size: u32,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            polling_time: Duration::from_micros(10),
            wake_up_interval: Duration::from_millis(500),
            inline: 64,
            sq_size: 384,
            rq_size: 384,
            mem: 131_072,
            wmem: 131_072,
            iomap_size: 0,
        }
    }
}

fn read_number(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("{CONF_DIR}/{name}"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Defaults {
    fn load() -> Defaults {
        let mut d = Defaults::default();
        if let Some(v) = read_number("polling_time") {
            d.polling_time = Duration::from_micros(v.into());
        }
        if let Some(v) = read_number("wake_up_interval") {
            d.wake_up_interval = Duration::from_millis(v.into());
        }
        if let Some(v) = read_number("inline_default") {
            d.inline = v;
        }
        if let Some(v) = read_number("sqsize_default") {
            d.sq_size = v;
        }
        if let Some(v) = read_number("rqsize_default") {
            d.rq_size = v;
        }
        if let Some(v) = read_number("mem_default") {
            d.mem = v.max(1);
        }
        if let Some(v) = read_number("wmem_default") {
            d.wmem = if v < SEND_LOW_WATER { 4096 } else { v };
        }
        if let Some(v) = read_number("iomap_size") {
            d.iomap_size = scale_to_value(value_to_scale(v.min(0xffff), 8), 8);
        }
        d
    }
}

/// The defaults, read on first use.
pub(crate) fn defaults() -> &'static Defaults {
    static DEFAULTS: OnceLock<Defaults> = OnceLock::new();
    DEFAULTS.get_or_init(Defaults::load)
}

//! The perftest programs the harness runs and reads.

use serde::{Deserialize, Serialize};

/// The perftest tools the harness knows how to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    IbSendLat,
    IbWriteLat,
    IbSendBw,
    IbWriteBw,
    IbReadBw,
}

impl Tool {
    pub fn command(self) -> &'static str {
        match self {
            Tool::IbSendLat => "ib_send_lat",
            Tool::IbWriteLat => "ib_write_lat",
            Tool::IbSendBw => "ib_send_bw",
            Tool::IbWriteBw => "ib_write_bw",
            Tool::IbReadBw => "ib_read_bw",
        }
    }

    pub fn is_latency(self) -> bool {
        matches!(self, Tool::IbSendLat | Tool::IbWriteLat)
    }

    /// What [`Measurement::headline`](super::Measurement::headline) reports for this tool.
    pub fn headline_unit(self) -> &'static str {
        if self.is_latency() {
            "typical_us"
        } else {
            "MiB/s"
        }
    }
}

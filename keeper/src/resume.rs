//! The one request of the keeper's own: `RESUME`, which tells a daemon that the connection it
//! is being given served an earlier daemon (spec §11.5).
//!
//! The keeper sends it after `SET_PROTOCOL_FEATURES` and before any vring is set up, with
//! `NEED_REPLY`; the daemon's front-end filter answers it (success) and never hands it to
//! vhost-user-backend. A daemon that does not know it fails the replay, and the keeper waits
//! for another daemon.

use crate::message::{Message, FLAG_NEED_REPLY, FLAG_VERSION};

/// The request number: far above vhost-user's own (which end at 44), so that a daemon that
/// does not know it refuses it instead of mistaking it for another.
pub const RESUME: u32 = 0x7672_0001;

/// What `RESUME` tells the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// How many daemons this connection has lost so far (1 for the first resume).
    pub losses: u64,
    /// The device configuration space as the previous daemon last described it (the answer
    /// to the front-end's last `GET_CONFIG`, from offset 0; empty when none was asked): the
    /// new daemon derives from it a state the driver cannot have seen (a new epoch).
    pub last_config: Vec<u8>,
}

impl Resume {
    /// The request.
    pub fn to_message(&self) -> Message {
        let mut payload = self.losses.to_le_bytes().to_vec();
        payload.extend_from_slice(&self.last_config);
        Message::new(RESUME, FLAG_VERSION | FLAG_NEED_REPLY, payload, Vec::new())
    }

    /// Reads a `RESUME` request's payload; `None` if it is too short.
    pub fn parse(payload: &[u8]) -> Option<Resume> {
        let (losses, config) = payload.split_first_chunk::<8>()?;
        Some(Resume {
            losses: u64::from_le_bytes(*losses),
            last_config: config.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_reads_back_whole() {
        let resume = Resume {
            losses: 3,
            last_config: vec![1, 2, 3, 4],
        };
        let message = resume.to_message();
        assert_eq!(message.request(), RESUME);
        assert!(crate::message::wants_reply(&message));
        assert_eq!(Resume::parse(&message.payload), Some(resume));
        assert_eq!(Resume::parse(&[0; 7]), None);
    }
}

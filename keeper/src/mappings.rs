//! The back-end request channel as the keeper relays it: which shared-memory mappings the
//! daemon made (`SHMEM_MAP`) and the front-end accepted, so that the keeper removes them when
//! the daemon is gone, and whose request each answer of the front-end belongs to.
//!
//! A daemon's mappings hold its host objects: QEMU keeps the mapped file (a uverbs file) open
//! while the mapping exists, and the host destroys the objects of a uverbs file only when the
//! last reference goes. Removing them (`SHMEM_UNMAP`, which QEMU serves from its main loop at
//! any time) is what gives the host its resources back after a daemon died (spec §11.5).

use std::collections::{BTreeSet, VecDeque};

use vhost::vhost_user::message::BackendReq;

use crate::message::{payload_u64, wants_reply, Message, FLAG_NEED_REPLY, FLAG_VERSION};

/// `VhostUserMMap`: shmid, padding, fd offset, shm offset, length, flags.
const MMAP_SIZE: usize = 40;

/// One mapping: shared-memory region id, offset and length (`SHMEM_UNMAP` names it so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mapping {
    pub shmid: u8,
    pub offset: u64,
    pub len: u64,
}

impl Mapping {
    fn parse(payload: &[u8]) -> Option<Mapping> {
        if payload.len() < MMAP_SIZE {
            return None;
        }
        Some(Mapping {
            shmid: payload[0],
            offset: payload_u64(payload, 16)?,
            len: payload_u64(payload, 24)?,
        })
    }

    /// The `SHMEM_UNMAP` request that removes it.
    pub fn unmap(&self, need_reply: bool) -> Message {
        let mut payload = vec![0u8; MMAP_SIZE];
        payload[0] = self.shmid;
        payload[16..24].copy_from_slice(&self.offset.to_le_bytes());
        payload[24..32].copy_from_slice(&self.len.to_le_bytes());
        let flags = FLAG_VERSION | if need_reply { FLAG_NEED_REPLY } else { 0 };
        Message::new(BackendReq::SHMEM_UNMAP as u32, flags, payload, Vec::new())
    }
}

/// Who sent a back-end request the front-end is to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The daemon: the answer goes back to it (if it is still there).
    Daemon,
    /// The keeper itself: the answer ends here.
    Keeper,
}

#[derive(Debug)]
struct Outstanding {
    origin: Origin,
    /// The mapping a `SHMEM_MAP` asks for, made once answered with success.
    map: Option<Mapping>,
}

/// The relayed back-end channel's mappings and outstanding requests.
#[derive(Debug, Default)]
pub struct Mappings {
    live: BTreeSet<Mapping>,
    outstanding: VecDeque<Outstanding>,
}

impl Mappings {
    /// Notes a back-end request on its way to the front-end.
    pub fn sent(&mut self, message: &Message, origin: Origin) {
        let request = message.request();
        let mapping = Mapping::parse(&message.payload);
        let mut map = None;
        if request == BackendReq::SHMEM_MAP as u32 {
            map = mapping;
        } else if request == BackendReq::SHMEM_UNMAP as u32 {
            if let Some(mapping) = mapping {
                self.live.remove(&mapping);
            }
        }
        if wants_reply(message) {
            self.outstanding.push_back(Outstanding { origin, map });
        } else if let Some(map) = map {
            // No answer will come: taken as made, as the daemon takes it.
            self.live.insert(map);
        }
    }

    /// Notes the front-end's answer to the oldest outstanding request; returns whose it was
    /// (`None`: no request was outstanding).
    pub fn answered(&mut self, answer: &Message) -> Option<Origin> {
        let outstanding = self.outstanding.pop_front()?;
        if let Some(map) = outstanding.map {
            if payload_u64(&answer.payload, 0) == Some(0) {
                self.live.insert(map);
            }
        }
        Some(outstanding.origin)
    }

    /// The `SHMEM_UNMAP` requests that remove every mapping made so far, which are from then
    /// on forgotten; their answers are the keeper's.
    pub fn unmap_all(&mut self, need_reply: bool) -> Vec<Message> {
        let removals: Vec<Message> = std::mem::take(&mut self.live)
            .iter()
            .map(|mapping| mapping.unmap(need_reply))
            .collect();
        if need_reply {
            for _ in &removals {
                self.outstanding.push_back(Outstanding {
                    origin: Origin::Keeper,
                    map: None,
                });
            }
        }
        removals
    }

    /// The mappings made and not removed.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Forgets what a connection that ended left (its answers will never come).
    pub fn clear(&mut self) {
        *self = Mappings::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::FLAG_REPLY;

    fn map(offset: u64, need_reply: bool) -> Message {
        let mapping = Mapping {
            shmid: 0,
            offset,
            len: 4096,
        };
        let mut message = mapping.unmap(need_reply);
        message.header[0..4].copy_from_slice(&(BackendReq::SHMEM_MAP as u32).to_le_bytes());
        message
    }

    fn answer(status: u64) -> Message {
        Message::new(
            BackendReq::SHMEM_MAP as u32,
            FLAG_VERSION | FLAG_REPLY,
            status.to_le_bytes().to_vec(),
            vec![],
        )
    }

    #[test]
    fn a_mapping_counts_once_the_front_end_accepted_it() {
        let mut maps = Mappings::default();
        maps.sent(&map(0, true), Origin::Daemon);
        maps.sent(&map(4096, true), Origin::Daemon);
        assert_eq!(maps.live(), 0);
        assert_eq!(maps.answered(&answer(0)), Some(Origin::Daemon));
        assert_eq!(maps.answered(&answer(1)), Some(Origin::Daemon), "refused");
        assert_eq!(maps.live(), 1);
        assert_eq!(maps.answered(&answer(0)), None, "nothing outstanding");
        // Without an answer asked for, the mapping is taken as made.
        maps.sent(&map(8192, false), Origin::Daemon);
        assert_eq!(maps.live(), 2);
    }

    #[test]
    fn the_keeper_removes_what_is_left_and_takes_the_answers() {
        let mut maps = Mappings::default();
        maps.sent(&map(0, false), Origin::Daemon);
        maps.sent(&map(4096, false), Origin::Daemon);
        // The daemon removed one itself.
        let mut removal = map(4096, false);
        removal.header[0..4].copy_from_slice(&(BackendReq::SHMEM_UNMAP as u32).to_le_bytes());
        maps.sent(&removal, Origin::Daemon);
        let removals = maps.unmap_all(true);
        assert_eq!(removals.len(), 1);
        assert_eq!(removals[0].request(), BackendReq::SHMEM_UNMAP as u32);
        assert_eq!(Mapping::parse(&removals[0].payload).unwrap().offset, 0);
        assert!(wants_reply(&removals[0]));
        assert_eq!(maps.live(), 0);
        assert_eq!(maps.answered(&answer(0)), Some(Origin::Keeper));
    }

    #[test]
    fn short_requests_map_nothing() {
        let mut maps = Mappings::default();
        let short = Message::new(
            BackendReq::SHMEM_MAP as u32,
            FLAG_VERSION,
            vec![0; 8],
            vec![],
        );
        maps.sent(&short, Origin::Daemon);
        assert_eq!(maps.live(), 0);
    }
}

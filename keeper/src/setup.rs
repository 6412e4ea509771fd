//! What the front-end set up on its connection, kept so that a new daemon can be given the
//! same, and what the daemon answered, so that the keeper can answer the front-end while no
//! daemon is there.
//!
//! Only set-up requests are kept, the latest of each kind: features, protocol features,
//! ownership, the guest memory regions the daemon accepted, and per vring its size, base,
//! addresses and eventfds. A vring stopped by `GET_VRING_BASE` loses its kick eventfd, so
//! that a replay leaves it stopped as the front-end did.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};

use crate::message::{payload_u64, wants_reply, Message, FLAG_NEED_REPLY, FLAG_VERSION};

const fn req(request: FrontendReq) -> u32 {
    request as u32
}

/// `VhostUserMemory`: region count and padding.
const TABLE_HEADER_SIZE: usize = 8;
/// One region: guest address, size, user address, mmap offset.
const REGION_SIZE: usize = 32;
/// `VhostUserConfig`: offset, size, flags.
const CONFIG_HEADER_SIZE: usize = 12;
/// Bit of a vring eventfd request's payload: no descriptor comes with it.
const VRING_NOFD: u64 = 1 << 8;

/// The vring set-up requests, in the order a replay sends them (the order QEMU starts a
/// vring in, eventfds for errors and calls before the kick that starts it).
const VRING_ORDER: [FrontendReq; 7] = [
    FrontendReq::SET_VRING_NUM,
    FrontendReq::SET_VRING_BASE,
    FrontendReq::SET_VRING_ADDR,
    FrontendReq::SET_VRING_ERR,
    FrontendReq::SET_VRING_CALL,
    FrontendReq::SET_VRING_KICK,
    FrontendReq::SET_VRING_ENABLE,
];

/// Requests answered with a value (not an acknowledgement).
const VALUE_REPLIES: [FrontendReq; 11] = [
    FrontendReq::GET_FEATURES,
    FrontendReq::GET_VRING_BASE,
    FrontendReq::GET_PROTOCOL_FEATURES,
    FrontendReq::GET_QUEUE_NUM,
    FrontendReq::GET_CONFIG,
    FrontendReq::GET_INFLIGHT_FD,
    FrontendReq::GET_MAX_MEM_SLOTS,
    FrontendReq::GET_STATUS,
    FrontendReq::GET_SHARED_OBJECT,
    FrontendReq::CHECK_DEVICE_STATE,
    FrontendReq::GET_SHMEM_CONFIG,
];

fn is_value_request(request: u32) -> bool {
    VALUE_REPLIES.iter().any(|&r| req(r) == request)
}

/// Whether the front-end waits for an answer to `message`.
pub fn expects_reply(message: &Message) -> bool {
    wants_reply(message) || is_value_request(message.request())
}

/// One guest memory region and its descriptor.
#[derive(Debug)]
struct Region {
    /// Guest address, size, user address, mmap offset, as the front-end sent them.
    bytes: [u8; REGION_SIZE],
    fd: OwnedFd,
}

impl Region {
    fn key(&self) -> &[u8] {
        // Guest address and size name a region (REM_MEM_REG sends them again).
        &self.bytes[..16]
    }
}

/// What the daemon answered, for answering the front-end alike without it.
#[derive(Debug, Default)]
struct Answers {
    features: Option<u64>,
    protocol_features: Option<u64>,
    queue_num: Option<u64>,
    max_mem_slots: Option<u64>,
    shmem_config: Option<Vec<u8>>,
    /// The configuration space from offset 0, as far as it was read.
    config: Vec<u8>,
}

/// One step of a replay: the request and how the daemon answers it.
#[derive(Debug)]
pub struct ReplayStep {
    pub message: Message,
    /// The daemon answers it (a value, or an acknowledgement asked for).
    pub answered: bool,
    /// The answer must hold these feature bits (`GET_FEATURES`, `GET_PROTOCOL_FEATURES`).
    pub must_offer: Option<u64>,
}

/// The set-up of one front-end connection.
#[derive(Debug, Default)]
pub struct FrontendSetup {
    owner: bool,
    features: Option<u64>,
    protocol_features: Option<u64>,
    /// Guest memory regions the daemon accepted.
    regions: Vec<Region>,
    /// A region offered with `ADD_MEM_REG`, kept once the daemon accepts it.
    offered: Option<Region>,
    /// Per vring: its latest set-up request of each kind.
    vrings: BTreeMap<u32, BTreeMap<u32, Message>>,
    answers: Answers,
}

impl FrontendSetup {
    /// Whether the front-end negotiated `REPLY_ACK`.
    pub fn reply_ack(&self) -> bool {
        self.protocol_features
            .is_some_and(|f| f & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0)
    }

    /// Whether a daemon ever answered the front-end's first request (the connection has a
    /// history a new daemon must be given).
    pub fn is_started(&self) -> bool {
        self.answers.features.is_some()
    }

    /// The configuration space as the daemon last described it.
    pub fn last_config(&self) -> &[u8] {
        &self.answers.config
    }

    /// Notes a front-end request on its way to the daemon (or to the keeper's own answer).
    /// Descriptors it carries are duplicated where they must outlive it.
    pub fn record(&mut self, message: &Message) -> io::Result<()> {
        let request = message.request();
        let payload = &message.payload;
        match request {
            r if r == req(FrontendReq::SET_OWNER) => self.owner = true,
            r if r == req(FrontendReq::RESET_OWNER) || r == req(FrontendReq::RESET_DEVICE) => {
                self.vrings.clear()
            }
            r if r == req(FrontendReq::SET_FEATURES) => {
                self.features = payload_u64(payload, 0).or(self.features)
            }
            r if r == req(FrontendReq::SET_PROTOCOL_FEATURES) => {
                self.protocol_features = payload_u64(payload, 0).or(self.protocol_features)
            }
            r if r == req(FrontendReq::SET_MEM_TABLE) => self.set_table(message)?,
            r if r == req(FrontendReq::ADD_MEM_REG) => {
                self.offered = match (region_bytes(payload, 8), message.fds.first()) {
                    (Some(bytes), Some(fd)) => Some(Region {
                        bytes,
                        fd: fd.try_clone()?,
                    }),
                    _ => None,
                };
                if !wants_reply(message) {
                    // No answer will say whether the daemon took it: keep it unless it is a
                    // device (a daemon's own mapping, never guest RAM).
                    self.accept_offered(true);
                }
            }
            r if r == req(FrontendReq::REM_MEM_REG) => {
                if let Some(bytes) = region_bytes(payload, 8) {
                    self.regions.retain(|region| region.key() != &bytes[..16]);
                }
            }
            r if r == req(FrontendReq::GET_VRING_BASE) => {
                if let Some(index) = vring_index(request, payload) {
                    if let Some(vring) = self.vrings.get_mut(&index) {
                        vring.remove(&req(FrontendReq::SET_VRING_KICK));
                    }
                }
            }
            r if VRING_ORDER.iter().any(|&v| req(v) == r) => {
                if let Some(index) = vring_index(request, payload) {
                    // Only the eventfd requests carry a descriptor, one at most.
                    let fds = match message.fds.first() {
                        Some(fd) if is_eventfd_request(request) => vec![fd.try_clone()?],
                        _ => Vec::new(),
                    };
                    let kept = Message::new(request, message.flags(), payload.clone(), fds);
                    self.vrings.entry(index).or_default().insert(request, kept);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Notes the daemon's `answer` to the front-end's `request`.
    pub fn learn(&mut self, request: u32, answer: &Message) {
        let value = payload_u64(&answer.payload, 0);
        match request {
            r if r == req(FrontendReq::GET_FEATURES) => self.answers.features = value,
            r if r == req(FrontendReq::GET_PROTOCOL_FEATURES) => {
                self.answers.protocol_features = value
            }
            r if r == req(FrontendReq::GET_QUEUE_NUM) => self.answers.queue_num = value,
            r if r == req(FrontendReq::GET_MAX_MEM_SLOTS) => self.answers.max_mem_slots = value,
            r if r == req(FrontendReq::GET_SHMEM_CONFIG) => {
                self.answers.shmem_config = Some(answer.payload.clone())
            }
            r if r == req(FrontendReq::GET_CONFIG) => self.learn_config(&answer.payload),
            r if r == req(FrontendReq::ADD_MEM_REG) => self.accept_offered(value == Some(0)),
            _ => {}
        }
    }

    /// The keeper's answer to `request` while no daemon is there; `None` when it has none
    /// (the request waits for the next daemon).
    pub fn answer(&mut self, request: &Message) -> Option<Message> {
        if !expects_reply(request) {
            return None;
        }
        let number = request.request();
        let value = |v: Option<u64>| v.map(|v| v.to_le_bytes().to_vec());
        let payload = match number {
            r if r == req(FrontendReq::GET_FEATURES) => value(self.answers.features),
            r if r == req(FrontendReq::GET_PROTOCOL_FEATURES) => {
                value(self.answers.protocol_features)
            }
            r if r == req(FrontendReq::GET_QUEUE_NUM) => value(self.answers.queue_num),
            r if r == req(FrontendReq::GET_MAX_MEM_SLOTS) => value(self.answers.max_mem_slots),
            r if r == req(FrontendReq::GET_SHMEM_CONFIG) => self.answers.shmem_config.clone(),
            r if r == req(FrontendReq::GET_CONFIG) => self.config_answer(&request.payload),
            r if r == req(FrontendReq::GET_VRING_BASE) => {
                // The base the front-end set: the keeper cannot read the ring. A new daemon
                // takes its position from the ring itself (spec §11.5).
                let index = vring_index(number, &request.payload)?;
                let base = self
                    .vrings
                    .get(&index)
                    .and_then(|v| v.get(&req(FrontendReq::SET_VRING_BASE)))
                    .and_then(|m| m.payload.get(4..8))
                    .map_or([0; 4], |b| b.try_into().unwrap_or([0; 4]));
                let mut payload = index.to_le_bytes().to_vec();
                payload.extend_from_slice(&base);
                Some(payload)
            }
            r if r == req(FrontendReq::ADD_MEM_REG) => {
                // Taken: the next daemon is given it.
                self.accept_offered(true);
                Some(0u64.to_le_bytes().to_vec())
            }
            _ if wants_reply(request) && !is_value_request(number) => {
                Some(0u64.to_le_bytes().to_vec())
            }
            _ => None,
        }?;
        Some(Message::new(
            number,
            FLAG_VERSION | crate::message::FLAG_REPLY,
            payload,
            Vec::new(),
        ))
    }

    /// The requests that give a new daemon this set-up, in order; `resume` and the back-end
    /// channel request (if any) go right after the protocol features.
    pub fn replay(
        &self,
        resume: Message,
        backend_channel: Option<Message>,
    ) -> io::Result<Vec<ReplayStep>> {
        let ack = if self.reply_ack() { FLAG_NEED_REPLY } else { 0 };
        let plain = |request: FrontendReq, payload: Vec<u8>, fds: Vec<OwnedFd>| {
            Message::new(req(request), FLAG_VERSION | ack, payload, fds)
        };
        let step = |message: Message| ReplayStep {
            answered: wants_reply(&message),
            message,
            must_offer: None,
        };
        let mut steps = vec![ReplayStep {
            message: Message::new(req(FrontendReq::GET_FEATURES), FLAG_VERSION, vec![], vec![]),
            answered: true,
            must_offer: Some(self.features.unwrap_or(0)),
        }];
        if self.owner {
            steps.push(step(Message::new(
                req(FrontendReq::SET_OWNER),
                FLAG_VERSION,
                vec![],
                vec![],
            )));
        }
        if let Some(protocol) = self.protocol_features {
            steps.push(ReplayStep {
                message: Message::new(
                    req(FrontendReq::GET_PROTOCOL_FEATURES),
                    FLAG_VERSION,
                    vec![],
                    vec![],
                ),
                answered: true,
                must_offer: Some(protocol),
            });
            // The front-end never asks for an answer here (REPLY_ACK is being negotiated).
            steps.push(step(Message::new(
                req(FrontendReq::SET_PROTOCOL_FEATURES),
                FLAG_VERSION,
                protocol.to_le_bytes().to_vec(),
                vec![],
            )));
        }
        steps.push(step(resume));
        if let Some(channel) = backend_channel {
            steps.push(step(channel));
        }
        if let Some(features) = self.features {
            steps.push(step(Message::new(
                req(FrontendReq::SET_FEATURES),
                FLAG_VERSION,
                features.to_le_bytes().to_vec(),
                vec![],
            )));
        }
        for region in &self.regions {
            let mut payload = vec![0u8; 8];
            payload.extend_from_slice(&region.bytes);
            let fd = region.fd.try_clone()?;
            steps.push(step(plain(FrontendReq::ADD_MEM_REG, payload, vec![fd])));
        }
        for vring in self.vrings.values() {
            for request in VRING_ORDER {
                if let Some(kept) = vring.get(&req(request)) {
                    let message = kept.try_clone()?.with_flags(FLAG_VERSION | ack);
                    steps.push(step(message));
                }
            }
        }
        Ok(steps)
    }

    /// The kick eventfds of the started vrings.
    pub fn kick_fds(&self) -> impl Iterator<Item = &OwnedFd> {
        self.vrings
            .values()
            .filter_map(|v| v.get(&req(FrontendReq::SET_VRING_KICK)))
            .filter_map(|m| m.fds.first())
    }

    fn set_table(&mut self, message: &Message) -> io::Result<()> {
        let payload = &message.payload;
        let count = payload.get(..4).map_or(0, |b| {
            u32::from_le_bytes(b.try_into().unwrap_or_default()) as usize
        });
        let mut regions = Vec::new();
        for (index, fd) in message.fds.iter().enumerate().take(count) {
            let Some(bytes) = region_bytes(payload, TABLE_HEADER_SIZE + index * REGION_SIZE) else {
                break;
            };
            if !is_device(fd) {
                regions.push(Region {
                    bytes,
                    fd: fd.try_clone()?,
                });
            }
        }
        self.regions = regions;
        Ok(())
    }

    fn accept_offered(&mut self, accepted: bool) {
        if let Some(region) = self.offered.take() {
            if accepted && !is_device(&region.fd) {
                self.regions.retain(|r| r.key() != region.key());
                self.regions.push(region);
            }
        }
    }

    fn learn_config(&mut self, answer: &[u8]) {
        let Some(header) = answer.get(..CONFIG_HEADER_SIZE) else {
            return;
        };
        let offset = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as usize;
        let data = &answer[CONFIG_HEADER_SIZE..];
        // The configuration space is small; a daemon answering beyond 4 KiB is not believed.
        let Some(end) = offset.checked_add(data.len()).filter(|&end| end <= 4096) else {
            return;
        };
        if self.answers.config.len() < end {
            self.answers.config.resize(end, 0);
        }
        self.answers.config[offset..end].copy_from_slice(data);
    }

    fn config_answer(&self, request: &[u8]) -> Option<Vec<u8>> {
        let header = request.get(..CONFIG_HEADER_SIZE)?;
        let offset = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
        let size = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
        let end = offset.checked_add(size).filter(|&end| end <= 4096)?;
        let mut answer = header.to_vec();
        let mut data = vec![0u8; size];
        if let Some(known) = self
            .answers
            .config
            .get(offset..end.min(self.answers.config.len()))
        {
            data[..known.len()].copy_from_slice(known);
        }
        answer.extend_from_slice(&data);
        Some(answer)
    }
}

/// Whether `request` hands over a vring eventfd.
fn is_eventfd_request(request: u32) -> bool {
    [
        FrontendReq::SET_VRING_KICK,
        FrontendReq::SET_VRING_CALL,
        FrontendReq::SET_VRING_ERR,
    ]
    .iter()
    .any(|&r| req(r) == request)
}

/// The vring a vring request names.
fn vring_index(request: u32, payload: &[u8]) -> Option<u32> {
    if is_eventfd_request(request) {
        let value = payload_u64(payload, 0)?;
        return Some((value & !VRING_NOFD & 0xff) as u32);
    }
    Some(u32::from_le_bytes(payload.get(..4)?.try_into().ok()?))
}

/// The region at `offset` of a memory-table request (8 for `ADD_MEM_REG`/`REM_MEM_REG`, whose
/// region follows 8 bytes of padding).
fn region_bytes(payload: &[u8], offset: usize) -> Option<[u8; REGION_SIZE]> {
    payload.get(offset..offset + REGION_SIZE)?.try_into().ok()
}

/// Whether `fd` is a character device: a daemon's queue mapping (a uverbs file), never guest
/// RAM. Keeping one would keep the dead daemon's host objects alive.
fn is_device(fd: &OwnedFd) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(file) = fd.try_clone().map(std::fs::File::from) else {
        return true;
    };
    file.metadata()
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(true)
}

#[cfg(test)]
pub(crate) mod tests;

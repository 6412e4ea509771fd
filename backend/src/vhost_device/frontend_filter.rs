//! Keeps the device's own shared-memory mappings out of the guest memory table.
//!
//! QEMU 11.1 inserts every range the back-end fills with `SHMEM_MAP` into guest-physical space
//! as fd-backed RAM, so QEMU's vhost memory listener hands each of them back to the back-end
//! as guest memory (`ADD_MEM_REG`, or a region of `SET_MEM_TABLE`) with the very fd the
//! back-end mapped: a uverbs fd, whose queue mmap offsets can be mapped exactly once. The
//! mapping vhost-user-backend then attempts fails, and the crate ends the connection. The
//! device never needs guest-physical access to its own queue region, so those regions are
//! answered here and never reach the crate.
//!
//! They are answered with a *refusal* where the front-end asked for an answer (REPLY_ACK).
//! QEMU 11.1 records every region the back-end accepted in a table of its own and removes it
//! again only while the device runs; a reset removes the mappings while the device is stopped,
//! so an accepted mapping would stay in that table after its memory is gone, and the next
//! device start (the guest's `DRIVER_OK` after a reboot) dereferences it and crashes QEMU
//! (spec §11.1). A refused region never enters the table. QEMU logs the refusal
//! ("vhost_set_mem_table failed") and goes on; a start while mappings exist (a stopped and
//! continued VM) fails instead, until the guest resets the device.
//!
//! Every front-end message passes through this filter on its way to the daemon. Messages
//! travel whole (header, payload and the descriptors attached to them); only the three
//! memory-table requests are looked at, and only regions whose descriptor the handler
//! recognises as its own device ([`DeviceHandler::is_device_mapping`]) are taken out.
//! Messages of the daemon go back to the front-end unchanged.
//!
//! Two more requests are looked at: `SET_PROTOCOL_FEATURES` passes on and is told to the
//! device; `SET_BACKEND_REQ_FD` (with `BACKEND_REQ` acknowledged and one descriptor) is
//! answered here and its socket handed to the device, which drives the back-end request
//! channel itself ([`BackendChannel`](super::backend_channel::BackendChannel):
//! several `SHMEM_MAP`s sent before their answers are read).
//!
//! The keeper's `RESUME` (a connection that served an earlier daemon, spec §11.5) is answered
//! here too and told to the device.
//!
//! [`DeviceHandler::is_device_mapping`]: super::handler::DeviceHandler::is_device_mapping

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::{debug, warn};
use parking_lot::Mutex;

use vrdma_keeper::resume::{Resume, RESUME};

use super::message::{payload_u64, wants_reply, Message};
#[cfg(test)]
use super::message::{FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION, HEADER_SIZE};

const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_BACKEND_REQ_FD: u32 = 21;
/// `VHOST_USER_PROTOCOL_F_BACKEND_REQ`: the front-end may hand over a back-end channel.
const PROTOCOL_F_BACKEND_REQ: u64 = 1 << 5;
const SET_MEM_TABLE: u32 = 5;
const ADD_MEM_REG: u32 = 37;
const REM_MEM_REG: u32 = 38;

/// `VhostUserSingleMemoryRegion`: padding, guest address, size, user address, mmap offset.
const SINGLE_REGION_SIZE: usize = 40;
/// `VhostUserMemory`: region count and padding, then regions of [`TABLE_REGION_SIZE`].
const TABLE_HEADER_SIZE: usize = 8;
/// One region of `VhostUserMemory`: guest address, size, user address, mmap offset.
const TABLE_REGION_SIZE: usize = 32;

/// Tells whether a memory-region descriptor maps the device itself.
pub type DeviceMappingTest = Arc<dyn Fn(&File) -> bool + Send + Sync>;

/// Told the protocol features the front-end acknowledged (`SET_PROTOCOL_FEATURES`), which
/// pass on unchanged: whether it negotiated `CONFIGURE_MEM_SLOTS` says whether it counts the
/// device's mappings against a memory-slot limit (QEMU does).
pub type ProtocolFeaturesHook = Arc<dyn Fn(u64) + Send + Sync>;

/// Given the back-end request channel (`SET_BACKEND_REQ_FD`) with the protocol features
/// acknowledged before it; the daemon never sees that request. The device drives the channel
/// itself ([`BackendChannel`](super::backend_channel::BackendChannel)).
pub type BackendChannelHook = Arc<dyn Fn(UnixStream, u64) + Send + Sync>;

/// Told that the connection served an earlier daemon (the keeper's `RESUME`, spec §11.5),
/// before any vring of it is set up again.
pub type ResumeHook = Arc<dyn Fn(Resume) + Send + Sync>;

/// What the filter asks and tells the device of its connection.
pub struct FilterHooks {
    /// Recognises the device's own mappings.
    pub is_device_mapping: DeviceMappingTest,
    /// Told the acknowledged protocol features.
    pub on_protocol_features: ProtocolFeaturesHook,
    /// Given the back-end request channel.
    pub on_backend_channel: BackendChannelHook,
    /// Told of a resumed connection.
    pub on_resume: ResumeHook,
}

/// What to do with one front-end message.
#[derive(Debug)]
enum Verdict {
    /// Pass it on (possibly rewritten).
    Forward(Message),
    /// Answer it here (when it asked for an answer) and drop it.
    Absorb { ack: Option<Message> },
}

/// The filter's memory of the regions it kept from the daemon.
struct RegionFilter {
    hooks: FilterHooks,
    /// The protocol features of the last `SET_PROTOCOL_FEATURES`.
    acked_protocol_features: u64,
    /// (guest address, size) of every region absorbed and not yet removed.
    absorbed: HashSet<(u64, u64)>,
}

impl RegionFilter {
    fn judge(&mut self, mut message: Message) -> Verdict {
        match message.request() {
            ADD_MEM_REG => {
                let region = single_region(&message.payload);
                let own = message.fds.len() == 1 && self.owns(&message.fds[0]);
                match (region, own) {
                    (Some(region), true) if wants_reply(&message) => {
                        debug!(
                            "device mapping at {:#x}+{:#x} refused as guest memory",
                            region.0, region.1
                        );
                        Verdict::Absorb {
                            ack: Some(Message::reply(message.request(), 1)),
                        }
                    }
                    (Some(region), true) => {
                        // Without REPLY_ACK the front-end records it whatever is answered.
                        debug!(
                            "device mapping at {:#x}+{:#x} kept out of guest memory",
                            region.0, region.1
                        );
                        self.absorbed.insert(region);
                        self.absorb(&message)
                    }
                    _ => Verdict::Forward(message),
                }
            }
            REM_MEM_REG => match single_region(&message.payload) {
                Some(region) if self.absorbed.remove(&region) => self.absorb(&message),
                _ => Verdict::Forward(message),
            },
            SET_MEM_TABLE => {
                self.filter_table(&mut message);
                Verdict::Forward(message)
            }
            SET_PROTOCOL_FEATURES => {
                if let Some(features) = payload_u64(&message.payload, 0) {
                    self.acked_protocol_features = features;
                    (self.hooks.on_protocol_features)(features);
                }
                Verdict::Forward(message)
            }
            // Without the feature or with other than one descriptor the daemon refuses it.
            SET_BACKEND_REQ_FD
                if message.fds.len() == 1
                    && self.acked_protocol_features & PROTOCOL_F_BACKEND_REQ != 0 =>
            {
                let verdict = self.absorb(&message);
                if let Some(fd) = message.fds.pop() {
                    (self.hooks.on_backend_channel)(
                        UnixStream::from(fd),
                        self.acked_protocol_features,
                    );
                }
                verdict
            }
            RESUME => {
                match Resume::parse(&message.payload) {
                    Some(resume) => (self.hooks.on_resume)(resume),
                    None => warn!("a RESUME too short to read; ignored"),
                }
                self.absorb(&message)
            }
            _ => Verdict::Forward(message),
        }
    }

    fn owns(&self, fd: &OwnedFd) -> bool {
        match fd.try_clone() {
            Ok(fd) => (self.hooks.is_device_mapping)(&File::from(fd)),
            Err(e) => {
                warn!("cannot inspect a memory-region descriptor: {e}");
                false
            }
        }
    }

    fn absorb(&self, message: &Message) -> Verdict {
        Verdict::Absorb {
            ack: wants_reply(message).then(|| Message::ack(message.request())),
        }
    }

    /// Takes the device's own regions out of a whole memory table (`SET_MEM_TABLE` replaces
    /// the table, so the absorbed set is rebuilt from it).
    fn filter_table(&mut self, message: &mut Message) {
        let Some(count) = message
            .payload
            .get(0..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
        else {
            return;
        };
        let count = count as usize;
        let needed = TABLE_HEADER_SIZE + count * TABLE_REGION_SIZE;
        if count != message.fds.len() || message.payload.len() < needed {
            // Malformed: the daemon refuses it with its own checks.
            return;
        }
        self.absorbed.clear();
        let mut regions = Vec::with_capacity(needed);
        let mut fds = Vec::with_capacity(count);
        for (index, fd) in std::mem::take(&mut message.fds).into_iter().enumerate() {
            let start = TABLE_HEADER_SIZE + index * TABLE_REGION_SIZE;
            let region = &message.payload[start..start + TABLE_REGION_SIZE];
            if self.owns(&fd) {
                let gpa = payload_u64(region, 0).unwrap_or_default();
                let size = payload_u64(region, 8).unwrap_or_default();
                self.absorbed.insert((gpa, size));
                continue;
            }
            regions.extend_from_slice(region);
            fds.push(fd);
        }
        let mut payload = Vec::with_capacity(TABLE_HEADER_SIZE + regions.len());
        payload.extend_from_slice(&(fds.len() as u32).to_le_bytes());
        payload.extend_from_slice(&message.payload[4..TABLE_HEADER_SIZE]);
        payload.extend_from_slice(&regions);
        message.header[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        message.payload = payload;
        message.fds = fds;
    }
}

/// (guest address, size) of an `ADD_MEM_REG`/`REM_MEM_REG` payload.
fn single_region(payload: &[u8]) -> Option<(u64, u64)> {
    if payload.len() < SINGLE_REGION_SIZE {
        return None;
    }
    Some((payload_u64(payload, 8)?, payload_u64(payload, 16)?))
}

/// The two relay threads of one connection. They end when either side closes.
pub struct FilterThreads {
    threads: [JoinHandle<()>; 2],
}

impl FilterThreads {
    /// Waits until both directions have ended.
    pub fn join(self) {
        for thread in self.threads {
            if thread.join().is_err() {
                warn!("a vhost-user filter thread panicked");
            }
        }
    }
}

/// Relays messages between `frontend` and `daemon` until either closes, keeping device
/// mappings recognised by `hooks.is_device_mapping` away from the daemon, telling
/// `hooks.on_protocol_features` what the front-end acknowledged, and handing the back-end
/// request channel to `hooks.on_backend_channel`.
pub fn start(
    frontend: UnixStream,
    daemon: UnixStream,
    hooks: FilterHooks,
) -> io::Result<FilterThreads> {
    let frontend_writer = Arc::new(Mutex::new(frontend.try_clone()?));
    let daemon_reader = daemon.try_clone()?;
    let mut filter = RegionFilter {
        hooks,
        acked_protocol_features: 0,
        absorbed: HashSet::new(),
    };
    let replies_to = frontend_writer.clone();
    let requests = thread::Builder::new()
        .name("vrdma-vu-requests".into())
        .spawn(move || {
            let result = (|| -> io::Result<()> {
                while let Some(message) = Message::receive(&frontend)? {
                    match filter.judge(message) {
                        Verdict::Forward(message) => message.send(&daemon)?,
                        Verdict::Absorb { ack: Some(ack) } => ack.send(&replies_to.lock())?,
                        Verdict::Absorb { ack: None } => {}
                    }
                }
                Ok(())
            })();
            if let Err(e) = result {
                debug!("front-end to daemon relay ended: {e}");
            }
            // The daemon then sees the front-end's disconnect.
            let _ = daemon.shutdown(std::net::Shutdown::Both);
            let _ = frontend.shutdown(std::net::Shutdown::Read);
        })?;
    let replies = thread::Builder::new()
        .name("vrdma-vu-replies".into())
        .spawn(move || {
            let result = (|| -> io::Result<()> {
                while let Some(message) = Message::receive(&daemon_reader)? {
                    message.send(&frontend_writer.lock())?;
                }
                Ok(())
            })();
            if let Err(e) = result {
                debug!("daemon to front-end relay ended: {e}");
            }
            // The daemon went away: let the front-end (and the request relay) see it.
            let _ = frontend_writer.lock().shutdown(std::net::Shutdown::Both);
        })?;
    Ok(FilterThreads {
        threads: [requests, replies],
    })
}

#[cfg(test)]
mod tests;

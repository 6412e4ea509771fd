//! Fuzzing what vrdma-keeper keeps of the messages it relays: arbitrary front-end requests,
//! daemon answers and back-end channel traffic against its [`FrontendSetup`] and
//! [`Mappings`].
//!
//! [`run_keeper_sequence`] decodes its input into a stream of such messages (any request
//! number, flags, payload length and descriptors: guest RAM, a character device as a daemon's
//! queue mapping is, an eventfd) and panics only when the keeper broke a rule:
//! - its own answers answer the request they are for, and a configuration read gets exactly
//!   the bytes it asked for;
//! - a replay never hands a daemon a character device (a lost daemon's mapping kept alive
//!   would keep that daemon's host objects), and its set-up requests ask for acknowledgements
//!   exactly when the front-end negotiated them;
//! - after `unmap_all` no mapping is left, and every removal names a mapping once.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;

use vhost::vhost_user::message::{BackendReq, FrontendReq, VhostUserProtocolFeatures};
use vrdma_keeper::mappings::{Mappings, Origin};
use vrdma_keeper::message::{
    payload_u64, wants_reply, Message, FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION,
};
use vrdma_keeper::resume::{Resume, RESUME};
use vrdma_keeper::setup::{expects_reply, FrontendSetup};

use super::bytes::ByteReader;

/// Descriptors a message may carry.
fn descriptor(r: &mut ByteReader<'_>) -> OwnedFd {
    match r.below(3) {
        0 => memfd(),
        1 => OwnedFd::from(std::fs::File::open("/dev/null").expect("/dev/null")),
        _ => {
            // SAFETY: plain eventfd creation; the result is checked and owned here alone.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            assert!(fd >= 0, "eventfd");
            // SAFETY: `fd` was just created and nothing else owns it.
            unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        }
    }
}

fn memfd() -> OwnedFd {
    let name = c"fuzz-ram";
    // SAFETY: a valid NUL-terminated name; the result is checked and owned here alone.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
}

fn is_char_device(fd: &OwnedFd) -> bool {
    let file = std::fs::File::from(fd.try_clone().expect("dup"));
    file.metadata()
        .is_ok_and(|m| m.file_type().is_char_device())
}

/// A message of the stream: `request` drawn from `0..limit` (sometimes the keeper's own),
/// arbitrary flags, a payload that is often the size the request expects.
fn message(r: &mut ByteReader<'_>, limit: u32, flags_base: u32) -> Message {
    let request = if r.chance(3) { RESUME } else { r.below(limit) };
    let mut flags = flags_base;
    if r.chance(50) {
        flags |= FLAG_NEED_REPLY;
    }
    let len = match r.below(4) {
        0 => 8,
        1 => 40,
        2 => 12 + r.below(80) as usize,
        _ => r.below(300) as usize,
    };
    let mut payload: Vec<u8> = (0..len).map(|_| r.u8()).collect();
    if r.chance(40) && payload.len() >= 8 {
        // Small values: vring indices, offsets and region counts that mean something.
        let small = u64::from(r.below(4));
        payload[..8].copy_from_slice(&small.to_le_bytes());
    }
    let fds = (0..r.below(3)).map(|_| descriptor(r)).collect();
    Message::new(request, FLAG_VERSION | flags, payload, fds)
}

/// Runs the stream `data` encodes; panics when the keeper broke a rule (module docs).
pub fn run_keeper_sequence(data: &[u8]) {
    let mut r = ByteReader::new(data);
    let mut setup = FrontendSetup::default();
    let mut mappings = Mappings::default();
    while !r.is_empty() {
        match r.below(6) {
            // A front-end request, and maybe the daemon's answer to it.
            0 | 1 => {
                let request = message(&mut r, 46, 0);
                setup.record(&request).expect("dup");
                if expects_reply(&request) && r.chance(70) {
                    let answer = message(&mut r, 46, FLAG_REPLY);
                    setup.learn(request.request(), &answer);
                }
            }
            // The keeper answering alone.
            2 => {
                let request = message(&mut r, 46, 0);
                setup.record(&request).expect("dup");
                if let Some(answer) = setup.answer(&request) {
                    check_answer(&request, &answer);
                }
            }
            // A replay to a new daemon.
            3 => {
                let resume = Resume {
                    losses: r.u64(),
                    last_config: setup.last_config().to_vec(),
                };
                let steps = setup.replay(resume.to_message(), None).expect("dup");
                check_replay(&setup, &steps);
            }
            // Back-end channel traffic.
            4 => {
                let request = message(&mut r, 12, 0);
                let origin = if r.chance(80) {
                    Origin::Daemon
                } else {
                    Origin::Keeper
                };
                mappings.sent(&request, origin);
                if r.chance(60) {
                    let answer = message(&mut r, 12, FLAG_REPLY);
                    let _ = mappings.answered(&answer);
                }
            }
            // The daemon lost: every mapping removed, each once.
            _ => {
                let removals = mappings.unmap_all(r.chance(50));
                assert_eq!(mappings.live(), 0);
                let named: BTreeSet<Vec<u8>> =
                    removals.iter().map(|m| m.payload[..32].to_vec()).collect();
                assert_eq!(named.len(), removals.len(), "a mapping removed twice");
                assert!(removals
                    .iter()
                    .all(|m| m.request() == BackendReq::SHMEM_UNMAP as u32));
            }
        }
    }
}

fn check_answer(request: &Message, answer: &Message) {
    assert_eq!(
        answer.request(),
        request.request(),
        "answered another request"
    );
    assert!(answer.is_reply(), "an answer without the reply flag");
    assert!(
        expects_reply(request),
        "answered a request that asked for nothing"
    );
    if request.request() == FrontendReq::GET_CONFIG as u32 {
        let size = payload_u64(&request.payload, 0).map(|v| (v >> 32) as usize);
        assert_eq!(
            Some(answer.payload.len() - 12),
            size,
            "a configuration read answered with other than the bytes asked for"
        );
    }
}

fn check_replay(setup: &FrontendSetup, steps: &[vrdma_keeper::setup::ReplayStep]) {
    let ack = setup.reply_ack();
    for step in steps {
        let m = &step.message;
        assert!(
            !m.fds.iter().any(is_char_device)
                || m.request() == FrontendReq::SET_VRING_KICK as u32
                || m.request() == FrontendReq::SET_VRING_CALL as u32
                || m.request() == FrontendReq::SET_VRING_ERR as u32,
            "a replay hands a daemon a character device as guest memory: {}",
            m.request()
        );
        let set_up = [
            FrontendReq::ADD_MEM_REG,
            FrontendReq::SET_VRING_NUM,
            FrontendReq::SET_VRING_KICK,
            FrontendReq::SET_VRING_ENABLE,
        ]
        .iter()
        .any(|&r| r as u32 == m.request());
        if set_up {
            assert_eq!(wants_reply(m), ack, "acknowledgements not as negotiated");
            assert_eq!(step.answered, ack);
        }
    }
    let protocol = steps
        .iter()
        .find(|s| s.message.request() == FrontendReq::GET_PROTOCOL_FEATURES as u32)
        .and_then(|s| s.must_offer);
    if ack {
        assert!(protocol.is_some_and(|p| p & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0));
    }
}

#[cfg(test)]
mod tests {
    use super::super::bytes::fixed_seed_inputs;
    use super::*;

    #[test]
    fn fixed_seed_streams_keep_the_keepers_rules() {
        for input in fixed_seed_inputs(0x5eed_0044, 400, 768) {
            run_keeper_sequence(&input);
        }
    }
}

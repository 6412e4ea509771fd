use std::os::fd::OwnedFd;

use super::*;
use crate::message::FLAG_REPLY;

pub(crate) fn request(r: FrontendReq, flags: u32, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Message {
    Message::new(req(r), FLAG_VERSION | flags, payload, fds)
}

pub(crate) fn value_answer(r: FrontendReq, value: u64) -> Message {
    Message::new(
        req(r),
        FLAG_VERSION | FLAG_REPLY,
        value.to_le_bytes().to_vec(),
        vec![],
    )
}

pub(crate) fn vring_state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

pub(crate) fn eventfd() -> OwnedFd {
    // SAFETY: plain eventfd creation; the result is checked and owned here alone.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
}

fn memfd() -> OwnedFd {
    let name = std::ffi::CString::new("guest-ram").unwrap();
    // SAFETY: a valid NUL-terminated name; the returned descriptor is checked and owned here.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just created and nothing else owns it.
    unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
}

fn region(guest: u64) -> Vec<u8> {
    let mut payload = vec![0u8; 8];
    for field in [guest, 0x1000, 0x7f00_0000_0000 + guest, 0] {
        payload.extend_from_slice(&field.to_le_bytes());
    }
    payload
}

/// The set-up QEMU gives a started device, with the daemon's answers.
pub(crate) fn started() -> FrontendSetup {
    let mut setup = FrontendSetup::default();
    let protocol = VhostUserProtocolFeatures::REPLY_ACK.bits();
    let mut send = |message: Message, answer: Option<Message>| {
        setup.record(&message).unwrap();
        if let Some(answer) = answer {
            setup.learn(message.request(), &answer);
        }
    };
    send(
        request(FrontendReq::GET_FEATURES, 0, vec![], vec![]),
        Some(value_answer(FrontendReq::GET_FEATURES, 0b1111)),
    );
    send(request(FrontendReq::SET_OWNER, 0, vec![], vec![]), None);
    send(
        request(FrontendReq::GET_PROTOCOL_FEATURES, 0, vec![], vec![]),
        Some(value_answer(
            FrontendReq::GET_PROTOCOL_FEATURES,
            protocol | 1,
        )),
    );
    send(
        request(
            FrontendReq::SET_PROTOCOL_FEATURES,
            0,
            protocol.to_le_bytes().to_vec(),
            vec![],
        ),
        None,
    );
    send(
        request(
            FrontendReq::SET_FEATURES,
            0,
            0b0101u64.to_le_bytes().to_vec(),
            vec![],
        ),
        None,
    );
    // Guest RAM, taken; then a region the daemon refuses (its own mapping).
    send(
        request(
            FrontendReq::ADD_MEM_REG,
            FLAG_NEED_REPLY,
            region(0),
            vec![memfd()],
        ),
        Some(value_answer(FrontendReq::ADD_MEM_REG, 0)),
    );
    send(
        request(
            FrontendReq::ADD_MEM_REG,
            FLAG_NEED_REPLY,
            region(0x10000),
            vec![memfd()],
        ),
        Some(value_answer(FrontendReq::ADD_MEM_REG, 1)),
    );
    for index in 0..2u32 {
        send(
            request(
                FrontendReq::SET_VRING_NUM,
                0,
                vring_state(index, 64),
                vec![],
            ),
            None,
        );
        send(
            request(
                FrontendReq::SET_VRING_BASE,
                0,
                vring_state(index, 7),
                vec![],
            ),
            None,
        );
        let mut addr = index.to_le_bytes().to_vec();
        addr.resize(40, 0);
        send(request(FrontendReq::SET_VRING_ADDR, 0, addr, vec![]), None);
        for eventfd_request in [FrontendReq::SET_VRING_KICK, FrontendReq::SET_VRING_CALL] {
            send(
                request(
                    eventfd_request,
                    FLAG_NEED_REPLY,
                    u64::from(index).to_le_bytes().to_vec(),
                    vec![eventfd()],
                ),
                Some(value_answer(eventfd_request, 0)),
            );
        }
        send(
            request(
                FrontendReq::SET_VRING_ENABLE,
                FLAG_NEED_REPLY,
                vring_state(index, 1),
                vec![],
            ),
            Some(value_answer(FrontendReq::SET_VRING_ENABLE, 0)),
        );
    }
    // Vring 1 stopped again.
    send(
        request(FrontendReq::GET_VRING_BASE, 0, vring_state(1, 0), vec![]),
        Some(Message::new(
            req(FrontendReq::GET_VRING_BASE),
            FLAG_VERSION | FLAG_REPLY,
            vring_state(1, 9),
            vec![],
        )),
    );
    let mut config = [0u8, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0].to_vec();
    config.extend(1..=16u8);
    send(
        request(FrontendReq::GET_CONFIG, 0, config[..12].to_vec(), vec![]),
        Some(Message::new(
            req(FrontendReq::GET_CONFIG),
            FLAG_VERSION | FLAG_REPLY,
            config,
            vec![],
        )),
    );
    setup
}

#[test]
fn a_replay_gives_the_daemon_what_the_front_end_set_up_in_order() {
    let setup = started();
    assert!(setup.is_started() && setup.reply_ack());
    assert_eq!(setup.last_config(), (1..=16u8).collect::<Vec<_>>());
    let resume = Message::new(
        crate::resume::RESUME,
        FLAG_VERSION | FLAG_NEED_REPLY,
        vec![0; 8],
        vec![],
    );
    let steps = setup.replay(resume, None).unwrap();
    let order: Vec<u32> = steps.iter().map(|s| s.message.request()).collect();
    let expected: Vec<u32> = [
        req(FrontendReq::GET_FEATURES),
        req(FrontendReq::SET_OWNER),
        req(FrontendReq::GET_PROTOCOL_FEATURES),
        req(FrontendReq::SET_PROTOCOL_FEATURES),
        crate::resume::RESUME,
        req(FrontendReq::SET_FEATURES),
        // Only the region the daemon took.
        req(FrontendReq::ADD_MEM_REG),
        req(FrontendReq::SET_VRING_NUM),
        req(FrontendReq::SET_VRING_BASE),
        req(FrontendReq::SET_VRING_ADDR),
        req(FrontendReq::SET_VRING_CALL),
        req(FrontendReq::SET_VRING_KICK),
        req(FrontendReq::SET_VRING_ENABLE),
        // Vring 1 is stopped: no kick starts it.
        req(FrontendReq::SET_VRING_NUM),
        req(FrontendReq::SET_VRING_BASE),
        req(FrontendReq::SET_VRING_ADDR),
        req(FrontendReq::SET_VRING_CALL),
        req(FrontendReq::SET_VRING_ENABLE),
    ]
    .to_vec();
    assert_eq!(order, expected);
    assert_eq!(steps[0].must_offer, Some(0b0101));
    assert_eq!(
        steps[2].must_offer,
        Some(VhostUserProtocolFeatures::REPLY_ACK.bits())
    );
    let add = &steps[6];
    assert_eq!(add.message.fds.len(), 1);
    assert!(
        add.answered,
        "REPLY_ACK: every set-up request is acknowledged"
    );
    assert_eq!(&add.message.payload[8..16], &0u64.to_le_bytes());
    assert!(steps[7..].iter().all(|s| s.answered));
    assert_eq!(setup.kick_fds().count(), 1);
}

#[test]
fn without_a_daemon_the_keeper_answers_what_it_knows() {
    let mut setup = started();
    let answer = |setup: &mut FrontendSetup, message: Message| {
        setup.answer(&message).map(|a| (a.request(), a.payload))
    };
    assert_eq!(
        answer(
            &mut setup,
            request(FrontendReq::GET_FEATURES, 0, vec![], vec![])
        ),
        Some((
            req(FrontendReq::GET_FEATURES),
            0b1111u64.to_le_bytes().to_vec()
        ))
    );
    // A configuration read inside and beyond what the daemon described.
    let read = [4u32, 16, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<u8>>();
    let (_, payload) = answer(
        &mut setup,
        request(FrontendReq::GET_CONFIG, 0, read, vec![]),
    )
    .unwrap();
    assert_eq!(&payload[12..24], &(5..=16u8).collect::<Vec<_>>()[..]);
    assert_eq!(&payload[24..], &[0; 4]);
    // The base the front-end set, for the vring it names.
    assert_eq!(
        answer(
            &mut setup,
            request(FrontendReq::GET_VRING_BASE, 0, vring_state(0, 0), vec![])
        ),
        Some((req(FrontendReq::GET_VRING_BASE), vring_state(0, 7)))
    );
    // An acknowledgement asked for.
    assert_eq!(
        answer(
            &mut setup,
            request(
                FrontendReq::SET_VRING_ENABLE,
                FLAG_NEED_REPLY,
                vring_state(0, 0),
                vec![]
            )
        ),
        Some((
            req(FrontendReq::SET_VRING_ENABLE),
            0u64.to_le_bytes().to_vec()
        ))
    );
    // Nothing asked, nothing answered; a value the keeper cannot know waits for a daemon.
    assert_eq!(
        answer(
            &mut setup,
            request(FrontendReq::SET_VRING_ENABLE, 0, vring_state(0, 0), vec![])
        ),
        None
    );
    assert_eq!(
        answer(
            &mut setup,
            request(FrontendReq::GET_INFLIGHT_FD, 0, vec![0; 16], vec![])
        ),
        None
    );
    // Guest RAM added meanwhile is taken, and given to the next daemon.
    let added = request(
        FrontendReq::ADD_MEM_REG,
        FLAG_NEED_REPLY,
        region(0x20000),
        vec![memfd()],
    );
    setup.record(&added).unwrap();
    assert!(answer(&mut setup, added).is_some());
    let resume = Message::new(crate::resume::RESUME, FLAG_VERSION, vec![0; 8], vec![]);
    let regions = setup
        .replay(resume, None)
        .unwrap()
        .iter()
        .filter(|s| s.message.request() == req(FrontendReq::ADD_MEM_REG))
        .count();
    assert_eq!(regions, 2);
}

#[test]
fn removed_regions_and_reset_vrings_are_not_replayed() {
    let mut setup = started();
    setup
        .record(&request(
            FrontendReq::REM_MEM_REG,
            FLAG_NEED_REPLY,
            region(0),
            vec![],
        ))
        .unwrap();
    setup
        .record(&request(FrontendReq::RESET_DEVICE, 0, vec![], vec![]))
        .unwrap();
    let resume = Message::new(crate::resume::RESUME, FLAG_VERSION, vec![0; 8], vec![]);
    let steps = setup.replay(resume, None).unwrap();
    assert_eq!(steps.len(), 6, "features, owner, protocol features, resume");
    assert_eq!(setup.kick_fds().count(), 0);
}

#[test]
fn malformed_requests_are_kept_out() {
    let mut setup = FrontendSetup::default();
    for r in [
        FrontendReq::SET_FEATURES,
        FrontendReq::SET_MEM_TABLE,
        FrontendReq::ADD_MEM_REG,
        FrontendReq::REM_MEM_REG,
        FrontendReq::SET_VRING_NUM,
        FrontendReq::SET_VRING_KICK,
        FrontendReq::GET_VRING_BASE,
        FrontendReq::GET_CONFIG,
    ] {
        for len in [0, 3, 8, 12, 39] {
            let message = request(r, FLAG_NEED_REPLY, vec![0xff; len], vec![]);
            setup.record(&message).unwrap();
            setup.learn(
                req(r),
                &Message::new(req(r), FLAG_REPLY, vec![0xff; len], vec![]),
            );
            let _ = setup.answer(&message);
        }
    }
    assert!(setup.regions.is_empty());
    assert!(
        setup.last_config().is_empty(),
        "a configuration beyond 4 KiB is not believed"
    );
}

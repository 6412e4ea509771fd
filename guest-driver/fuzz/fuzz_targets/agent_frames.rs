//! The frames of the guest agent's socket, as either side decodes them: the agent decodes
//! what any application process sends, an application what the agent sends. Input: one byte
//! of descriptor count, four of frame kind, then the payload.

#![no_main]

use std::os::fd::OwnedFd;

use libfuzzer_sys::fuzz_target;
use vrdma::transport::agent::protocol::{Frame, MAX_FDS};

fuzz_target!(|data: &[u8]| {
    let Some((&nfds, rest)) = data.split_first() else {
        return;
    };
    let Some((kind, payload)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let fds: Vec<OwnedFd> = (0..usize::from(nfds) % (MAX_FDS + 2))
        .map(|_| {
            std::fs::File::open("/dev/null")
                .expect("/dev/null")
                .into()
        })
        .collect();
    let _ = Frame::decode(u32::from_le_bytes(*kind), payload.to_vec(), fds);
});

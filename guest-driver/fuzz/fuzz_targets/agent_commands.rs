//! What the guest agent does with a command an application process sends in VM mode: plan it
//! (what it names, creates, destroys), rewrite its memory to guest-physical pages, check and
//! record it in the ownership table with a device response. Input: one byte choosing the client
//! and whether the device takes extents, one byte of response length, the response, then the
//! raw request.
//!
//! Beyond not panicking: what is pinned covers the named pages, each once; a rewritten request
//! decodes, and lists only the process's own pages.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_guestd::ownership::{plan, Ownership, Quotas};
use vrdma_guestd::translate::ProcessRam;
use vrdma_spec::ControlRequest;

const BASE: u64 = 1 << 30;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Some((&response_len, rest)) = rest.split_first() else {
        return;
    };
    let Some((response, request)) = rest.split_at_checked(usize::from(response_len)) else {
        return;
    };
    let pages: Vec<u64> = (0..64u64).map(|i| 0x100_0000 + (i * 7 % 64) * 0x1000).collect();
    let process = ProcessRam::new(BASE, pages.len() as u64);
    let guest_page = |addr: u64| pages.get(((addr - BASE) / 0x1000) as usize).copied();
    let client = u64::from(choice & 3);
    let mut ownership = Ownership::new(Quotas::default());
    let Ok(planned) = plan(request) else {
        return;
    };
    let Ok(decoded) = ControlRequest::decode(request) else {
        return;
    };
    let registration = process.registration(&decoded).ok().flatten();
    if let Some(registration) = &registration {
        // What is pinned covers every page the MR names, each once.
        let runs = registration.runs();
        let covered = |page: &u64| runs.iter().any(|&(start, len)| (start..start + len).contains(page));
        assert!(registration.pages().iter().all(covered));
        assert!(runs.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
    }
    let rewritten = registration
        .map(|registration| registration.rewrite(guest_page, choice & 4 != 0, 1024));
    if let Some(Ok(rewritten)) = rewritten {
        let again = ControlRequest::decode(&rewritten).expect("a rewritten request decodes");
        let listed: Vec<u64> = match again {
            ControlRequest::RegMr(m) => m.pages.iter().collect(),
            ControlRequest::ReregMr(m) => m.pages.iter().collect(),
            ControlRequest::RegMrExtents(m) => m
                .extents
                .iter()
                .flat_map(|(start, len)| (0..len / 0x1000).map(move |i| start + i * 0x1000))
                .collect(),
            other => panic!("rewritten into {other:?}"),
        };
        assert!(listed.iter().all(|page| pages.contains(page)));
    }
    let _ = ownership.check(client, &planned);
    ownership.record(client, &planned, response);
    for (kind, handle) in ownership.release_order(client) {
        let _ = plan(&Ownership::destroy_request(kind, handle)).expect("destroys decode");
    }
});

//! What the guest agent does with a command an application process sends in VM mode: plan it
//! (what it names, creates, destroys), rewrite its memory to guest-physical pages, check and
//! record it in the ownership table with a device response. Input: one byte choosing the client
//! and whether the device takes extents, one byte of response length, the response, then the
//! raw request.
//!
//! Beyond not panicking: a rewritten request decodes, and lists only the process's own pages.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_guestd::ownership::{plan, Ownership, Quotas};
use vrdma_guestd::translate::ProcessPages;
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
    let process = ProcessPages::new(BASE, pages.clone());
    let client = u64::from(choice & 3);
    let mut ownership = Ownership::new(Quotas::default());
    let Ok(planned) = plan(request) else {
        return;
    };
    let Ok(decoded) = ControlRequest::decode(request) else {
        return;
    };
    if let Ok(Some(rewritten)) = process.rewrite(&decoded, choice & 4 != 0, 1024) {
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

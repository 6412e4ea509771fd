//! Feeds arbitrary bytes to every vrdma decoder; anything that decodes must re-encode
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vrdma_spec::{ControlRequest, ControlResponse, DeviceConfig, Event, Opcode};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = ControlRequest::decode(data) {
        assert_eq!(req.to_vec(), data);
    }
    for op in Opcode::ALL {
        if let Ok(resp) = ControlResponse::decode(op, data) {
            assert_eq!(resp.to_vec(), data);
        }
    }
    if let Ok(ev) = Event::decode(data) {
        assert_eq!(ev.to_bytes().as_slice(), data);
    }
    drain_arbitrary_doorbell_area(data);
    let _ = DeviceConfig::decode(data);
});

/// The device drains a doorbell area whose every word the driver controls: whatever it holds,
/// draining terminates within one lap and kicks only indices inside the area.
fn drain_arbitrary_doorbell_area(bytes: &[u8]) {
    use std::sync::atomic::AtomicU32;
    use vrdma_spec::doorbell::{area_bytes, DoorbellArea};
    let words: Vec<AtomicU32> = bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            AtomicU32::new(u32::from_le_bytes(w))
        })
        .collect();
    let mut slots = 1u32;
    while area_bytes(slots * 2) <= words.len() * 4 {
        slots *= 2;
    }
    if let Ok(area) = DoorbellArea::new(&words, slots) {
        let mut head = words.first().map_or(0, |w| w.load(std::sync::atomic::Ordering::Relaxed));
        let consumed = area.drain(&mut head, |i| assert!(i < slots));
        assert!(consumed <= slots as usize);
    }
}

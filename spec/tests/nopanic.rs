//! No decoder panics on random or mutated input, and whatever decodes re-encodes to
//! the same bytes.

mod common;

use common::*;
use vrdma_spec::{ControlRequest, ControlResponse, DeviceConfig, Event, Opcode};

fn check_all(bytes: &[u8]) {
    if let Ok(req) = ControlRequest::decode(bytes) {
        assert_eq!(req.to_vec(), bytes, "request encoding is canonical");
        assert!(req.required_features() & !vrdma_spec::features::VRDMA_F_ALL == 0);
    }
    for op in Opcode::ALL {
        if let Ok(resp) = ControlResponse::decode(op, bytes) {
            assert_eq!(resp.to_vec(), bytes, "response encoding is canonical");
        }
    }
    if let Ok(ev) = Event::decode(bytes) {
        assert_eq!(ev.to_bytes().as_slice(), bytes);
    }
    drain_arbitrary_doorbell_area(bytes);
    let _ = DeviceConfig::decode(bytes);
}

#[test]
fn random_buffers() {
    let mut rng = Rng::new(0x5eed);
    let mut buf = vec![0u8; 512];
    for i in 0..20_000 {
        let len = rng.below(buf.len() + 1);
        rng.fill(&mut buf[..len]);
        // bias the header toward valid opcodes so bodies get exercised
        if len >= 8 && i % 2 == 0 {
            let op = Opcode::ALL[rng.below(Opcode::ALL.len())] as u16;
            buf[..2].copy_from_slice(&op.to_le_bytes());
            buf[2..8].fill(0);
        }
        check_all(&buf[..len]);
    }
}

#[test]
fn mutated_valid_buffers() {
    let pages = page_list();
    let mut seeds: Vec<Vec<u8>> = all_requests(&pages).iter().map(|r| r.to_vec()).collect();
    for op in Opcode::ALL {
        seeds.push(ControlResponse::Ok(body_for(op)).to_vec());
    }
    let mut rng = Rng::new(42);
    for _ in 0..100_000 {
        let mut b = seeds[rng.below(seeds.len())].clone();
        for _ in 0..=rng.below(4) {
            match rng.below(6) {
                0 if !b.is_empty() => {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
                1 if !b.is_empty() => {
                    let i = rng.below(b.len());
                    b[i] = rng.next_u64() as u8;
                }
                2 => b.truncate(rng.below(b.len() + 1)),
                3 => b.push(rng.next_u64() as u8),
                4 if b.len() >= 4 => {
                    // plant an extreme 32-bit value
                    let i = rng.below(b.len() - 3);
                    let v = [0u32, 1, u32::MAX, 0x8000_0000, 12, 30, 31][rng.below(7)];
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                _ if b.len() >= 8 => {
                    // plant an extreme 64-bit value
                    let i = rng.below(b.len() - 7);
                    let v = [0u64, u64::MAX, 1 << 63, !0xfffu64][rng.below(4)];
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
                _ => {}
            }
        }
        check_all(&b);
    }
}

#[test]
fn absurd_page_counts_do_not_allocate_or_panic() {
    // npages = u32::MAX with a length that matches it, but no list: must be Short.
    let mut req = reg_mr_req();
    req.iova = vrdma_spec::Le64::new(0);
    req.length = vrdma_spec::Le64::new(u64::from(u32::MAX) << 12);
    req.npages = vrdma_spec::Le32::new(u32::MAX);
    let bytes = ControlRequest::RegMr(vrdma_spec::RegMr::new(req, &[])).to_vec();
    assert!(matches!(
        ControlRequest::decode(&bytes),
        Err(vrdma_spec::DecodeError::Short { .. })
    ));
}

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
        let mut head = words
            .first()
            .map_or(0, |w| w.load(std::sync::atomic::Ordering::Relaxed));
        let consumed = area.drain(&mut head, |i| assert!(i < slots));
        assert!(consumed <= slots as usize);
    }
}

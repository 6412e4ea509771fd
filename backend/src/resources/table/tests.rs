// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Tests of handle tables: handles, generations, quotas, references, and a model check.

use super::*;
use crate::resources::kind::MAX_OBJECTS_PER_TABLE;
use std::collections::HashMap;

fn table(limit: u32) -> HandleTable<String> {
    HandleTable::new(ResourceKind::Qp, limit).unwrap()
}

#[test]
fn handles_name_their_objects() {
    let mut qps = table(8);
    let a = qps.insert("a".to_owned()).unwrap();
    let b = qps.insert("b".to_owned()).unwrap();
    assert_ne!(a, b);
    assert_ne!(a.raw(), 0);
    assert_ne!(b.raw(), 0);
    assert_eq!(qps.get(a).unwrap(), "a");
    assert_eq!(qps.get(b).unwrap(), "b");
    qps.get_mut(b).unwrap().push('!');
    assert_eq!(qps.get(b).unwrap(), "b!");
    assert_eq!(qps.len(), 2);
    assert_eq!(
        qps.iter().map(|(h, v)| (h, v.as_str())).collect::<Vec<_>>(),
        vec![(a, "a"), (b, "b!")]
    );
    assert_eq!(qps.remove(a).unwrap(), "a");
    assert_eq!(qps.len(), 1);
    assert!(!qps.contains(a));
    assert!(qps.contains(b));
}

#[test]
fn zero_and_unknown_handles_are_refused() {
    let mut qps = table(4);
    let bad = |raw| ResourceError::BadHandle {
        kind: ResourceKind::Qp,
        handle: raw,
    };
    assert_eq!(qps.get(Handle::from_raw(0)), Err(bad(0)));
    let h = qps.insert("x".to_owned()).unwrap();
    for raw in [0, 1, 2, 3, u32::MAX, h.raw() ^ 1, h.raw() + 4] {
        if raw != h.raw() {
            assert_eq!(qps.get(Handle::from_raw(raw)), Err(bad(raw)), "{raw:#x}");
        }
    }
    // A handle from another guest's table is just unknown here.
    let mut other = table(4);
    other.insert("y".to_owned()).unwrap();
    let foreign = other.insert("z".to_owned()).unwrap();
    assert_eq!(qps.get(foreign), Err(bad(foreign.raw())));
}

#[test]
fn stale_handles_stay_invalid_after_reuse() {
    let mut qps = table(1);
    let first = qps.insert("first".to_owned()).unwrap();
    qps.remove(first).unwrap();
    assert!(qps.get(first).is_err());
    assert!(qps.remove(first).is_err());
    let second = qps.insert("second".to_owned()).unwrap();
    assert_ne!(first, second);
    assert!(qps.get(first).is_err());
    assert_eq!(qps.get(second).unwrap(), "second");
    assert!(matches!(
        qps.remove(first),
        Err(ResourceError::BadHandle { .. })
    ));
    assert_eq!(qps.len(), 1);
}

#[test]
fn freed_slots_are_reused_oldest_first() {
    let mut qps = table(4);
    let handles: Vec<_> = (0..4).map(|i| qps.insert(i.to_string()).unwrap()).collect();
    qps.remove(handles[2]).unwrap();
    qps.remove(handles[0]).unwrap();
    let index = |h: Handle| h.raw() & 3;
    assert_eq!(index(qps.insert("x".to_owned()).unwrap()), 2);
    assert_eq!(index(qps.insert("y".to_owned()).unwrap()), 0);
}

#[test]
fn generation_wraps_around_skipping_zero() {
    // The largest table leaves 8 generation bits: generations 1..=255.
    let mut table = HandleTable::new(ResourceKind::Mr, MAX_OBJECTS_PER_TABLE).unwrap();
    let first = table.insert(0u32).unwrap();
    assert_eq!(first.raw(), 1 << 24);
    table.remove(first).unwrap();
    let mut seen = vec![first];
    for generation in 2..=255u32 {
        let handle = table.insert(generation).unwrap();
        assert_eq!(handle.raw(), generation << 24);
        for stale in &seen {
            assert!(table.get(*stale).is_err());
        }
        seen.push(handle);
        table.remove(handle).unwrap();
    }
    // Wrapped: the 256th occupant of slot 0 gets generation 1 again, never 0.
    let wrapped = table.insert(256).unwrap();
    assert_eq!(wrapped, first);
    assert_eq!(*table.get(first).unwrap(), 256);
}

#[test]
fn single_slot_table_uses_the_whole_handle_as_generation() {
    let mut table = HandleTable::new(ResourceKind::Pd, 1).unwrap();
    assert_eq!(table.max_generation, u32::MAX);
    // Fast-forward to the last generation and check it wraps to 1, not 0.
    let handle = table.insert(()).unwrap();
    assert_eq!(handle.raw(), 1);
    table.remove(handle).unwrap();
    table.slots[0].generation = u32::MAX - 1;
    let last = table.insert(()).unwrap();
    assert_eq!(last.raw(), u32::MAX);
    table.remove(last).unwrap();
    assert_eq!(table.insert(()).unwrap().raw(), 1);
}

#[test]
fn count_quota_is_exact() {
    for limit in [0u32, 1, 2, 3, 64, 1000] {
        let mut t = table(limit);
        let handles: Vec<_> = (0..limit)
            .map(|i| t.insert(i.to_string()).unwrap())
            .collect();
        let full = ResourceError::Quota {
            kind: ResourceKind::Qp,
            limit,
        };
        assert_eq!(t.check_room(0), Err(full.clone()));
        assert_eq!(t.insert("extra".to_owned()), Err(full.clone()));
        assert_eq!(t.len(), limit as usize);
        if let Some(&last) = handles.last() {
            t.remove(last).unwrap();
            assert!(t.insert("again".to_owned()).is_ok());
            assert_eq!(t.insert("extra".to_owned()), Err(full));
        }
        // Every handle fits the index/generation split of this limit.
        let mut raws: Vec<u32> = t.iter().map(|(h, _)| h.raw()).collect();
        raws.sort_unstable();
        raws.dedup();
        assert_eq!(raws.len(), limit as usize);
    }
}

#[test]
fn byte_quota_is_exact_and_overflow_safe() {
    let mut mrs = HandleTable::with_byte_limit(ResourceKind::Mr, 16, 1000).unwrap();
    let a = mrs.insert_with_bytes('a', 600).unwrap();
    assert_eq!(
        mrs.insert_with_bytes('b', 401),
        Err(ResourceError::ByteQuota {
            kind: ResourceKind::Mr,
            limit: 1000,
            used: 600,
            requested: 401
        })
    );
    let b = mrs.insert_with_bytes('b', 400).unwrap();
    assert_eq!(mrs.bytes(), 1000);
    assert!(mrs.insert_with_bytes('c', 1).is_err());
    assert!(mrs.insert_with_bytes('c', u64::MAX).is_err());
    mrs.insert_with_bytes('z', 0).unwrap();
    mrs.remove(a).unwrap();
    assert_eq!(mrs.bytes(), 400);
    assert!(mrs.check_room(600).is_ok());
    assert!(mrs.check_room(601).is_err());
    mrs.remove(b).unwrap();
    assert_eq!(mrs.bytes(), 0);

    let mut unlimited = HandleTable::new(ResourceKind::Mr, 4).unwrap();
    unlimited.insert_with_bytes((), u64::MAX).unwrap();
    assert!(matches!(
        unlimited.insert_with_bytes((), 1),
        Err(ResourceError::ByteQuota { .. })
    ));
    assert!(unlimited.insert_with_bytes((), 0).is_ok());
}

#[test]
fn referenced_objects_are_busy() {
    let mut pds = HandleTable::new(ResourceKind::Pd, 4).unwrap();
    let pd = pds.insert("pd").unwrap();
    pds.acquire(pd).unwrap();
    pds.acquire(pd).unwrap();
    assert_eq!(pds.refs(pd), Ok(2));
    assert_eq!(
        pds.remove(pd),
        Err(ResourceError::Busy {
            kind: ResourceKind::Pd,
            handle: pd.raw(),
            refs: 2
        })
    );
    pds.release(pd).unwrap();
    assert!(pds.remove(pd).is_err());
    pds.release(pd).unwrap();
    assert_eq!(
        pds.release(pd),
        Err(ResourceError::NotReferenced {
            kind: ResourceKind::Pd,
            handle: pd.raw()
        })
    );
    assert_eq!(pds.remove(pd), Ok("pd"));
    assert!(matches!(
        pds.acquire(pd),
        Err(ResourceError::BadHandle { .. })
    ));

    let pd = pds.insert("pd").unwrap();
    pds.slots[(pd.raw() & 3) as usize]
        .entry
        .as_mut()
        .unwrap()
        .refs = u32::MAX;
    assert!(matches!(
        pds.acquire(pd),
        Err(ResourceError::TooManyRefs { .. })
    ));
    assert_eq!(pds.refs(pd), Ok(u32::MAX));
}

#[test]
fn drain_empties_in_index_order_ignoring_refs() {
    let mut mrs = HandleTable::with_byte_limit(ResourceKind::Mr, 8, 100).unwrap();
    let handles: Vec<_> = (0..5)
        .map(|i| mrs.insert_with_bytes(i, 10).unwrap())
        .collect();
    mrs.remove(handles[1]).unwrap();
    mrs.acquire(handles[3]).unwrap();
    let drained = mrs.drain();
    assert_eq!(
        drained,
        vec![
            (handles[0], 0),
            (handles[2], 2),
            (handles[3], 3),
            (handles[4], 4)
        ]
    );
    assert!(mrs.is_empty());
    assert_eq!(mrs.bytes(), 0);
    for handle in handles {
        assert!(mrs.get(handle).is_err());
    }
    // The table is usable again, with its full quota.
    for i in 0..8 {
        mrs.insert_with_bytes(i, 12).unwrap();
    }
    assert!(mrs.insert(9).is_err());
}

#[test]
fn tables_from_quotas() {
    let quotas = Quotas::default();
    assert!(quotas.validate().is_ok());
    let mrs = HandleTable::<()>::from_quotas(ResourceKind::Mr, &quotas).unwrap();
    assert_eq!((mrs.limit(), mrs.byte_limit()), (4096, 16 << 30));
    let pds = HandleTable::<()>::from_quotas(ResourceKind::Pd, &quotas).unwrap();
    assert_eq!((pds.limit(), pds.byte_limit()), (64, u64::MAX));
    assert_eq!(pds.kind(), ResourceKind::Pd);

    let too_many = Quotas {
        srqs: MAX_OBJECTS_PER_TABLE + 1,
        ..quotas
    };
    let error = ResourceError::LimitTooLarge {
        kind: ResourceKind::Srq,
        limit: MAX_OBJECTS_PER_TABLE + 1,
    };
    assert_eq!(too_many.validate(), Err(error.clone()));
    assert_eq!(
        HandleTable::<()>::from_quotas(ResourceKind::Srq, &too_many).unwrap_err(),
        error
    );
    assert_eq!(
        error.to_string(),
        "SRQ limit 16777217 exceeds the maximum of 16777216"
    );
}

/// xorshift64*: deterministic pseudo-random numbers for the model test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, PartialEq)]
struct ModelEntry {
    value: u64,
    refs: u32,
    bytes: u64,
}

#[test]
fn random_operations_match_a_model() {
    for (seed, limit, byte_limit) in [
        (1u64, 1u32, 10u64),
        (2, 7, 300),
        (3, 64, 5000),
        (4, 3, u64::MAX),
    ] {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut table = HandleTable::with_byte_limit(ResourceKind::Cq, limit, byte_limit).unwrap();
        let mut model: HashMap<u32, ModelEntry> = HashMap::new();
        let mut issued: Vec<Handle> = Vec::new();
        for step in 0..20_000u64 {
            let live: Vec<u32> = {
                let mut keys: Vec<u32> = model.keys().copied().collect();
                keys.sort_unstable();
                keys
            };
            // Mostly handles that were issued (live or stale), sometimes arbitrary ones.
            let pick = |rng: &mut Rng| -> Handle {
                match rng.below(4) {
                    0 if !live.is_empty() => {
                        Handle::from_raw(live[rng.below(live.len() as u64) as usize])
                    }
                    1 | 2 if !issued.is_empty() => issued[rng.below(issued.len() as u64) as usize],
                    _ => Handle::from_raw(rng.next() as u32),
                }
            };
            match rng.below(100) {
                0..=34 => {
                    let bytes = if rng.below(2) == 0 { 0 } else { rng.below(200) };
                    let used: u64 = model.values().map(|e| e.bytes).sum();
                    let fits = model.len() < limit as usize
                        && used.checked_add(bytes).is_some_and(|t| t <= byte_limit);
                    match table.insert_with_bytes(step, bytes) {
                        Ok(handle) => {
                            assert!(fits, "step {step}: insert beyond quota");
                            assert_ne!(handle.raw(), 0);
                            let previous = model.insert(
                                handle.raw(),
                                ModelEntry {
                                    value: step,
                                    refs: 0,
                                    bytes,
                                },
                            );
                            assert!(
                                previous.is_none(),
                                "step {step}: handle {handle} reused while live"
                            );
                            issued.push(handle);
                        }
                        Err(error) => {
                            assert!(!fits, "step {step}: refused within quota: {error}");
                            assert!(matches!(
                                error,
                                ResourceError::Quota { .. } | ResourceError::ByteQuota { .. }
                            ));
                        }
                    }
                }
                35..=59 => {
                    let handle = pick(&mut rng);
                    let result = table.remove(handle);
                    match model.get(&handle.raw()) {
                        None => assert!(matches!(result, Err(ResourceError::BadHandle { .. }))),
                        Some(entry) if entry.refs > 0 => {
                            assert!(
                                matches!(result, Err(ResourceError::Busy { refs, .. }) if refs == entry.refs)
                            )
                        }
                        Some(entry) => {
                            assert_eq!(result, Ok(entry.value));
                            model.remove(&handle.raw());
                        }
                    }
                }
                60..=69 => {
                    let handle = pick(&mut rng);
                    let result = table.acquire(handle);
                    match model.get_mut(&handle.raw()) {
                        None => assert!(result.is_err()),
                        Some(entry) => {
                            assert_eq!(result, Ok(()));
                            entry.refs += 1;
                        }
                    }
                }
                70..=79 => {
                    let handle = pick(&mut rng);
                    let result = table.release(handle);
                    match model.get_mut(&handle.raw()) {
                        None => assert!(matches!(result, Err(ResourceError::BadHandle { .. }))),
                        Some(entry) if entry.refs == 0 => {
                            assert!(matches!(result, Err(ResourceError::NotReferenced { .. })))
                        }
                        Some(entry) => {
                            assert_eq!(result, Ok(()));
                            entry.refs -= 1;
                        }
                    }
                }
                80..=98 => {
                    let handle = pick(&mut rng);
                    match model.get_mut(&handle.raw()) {
                        None => {
                            assert!(table.get(handle).is_err());
                            assert!(table.get_mut(handle).is_err());
                            assert!(!table.contains(handle));
                        }
                        Some(entry) => {
                            assert_eq!(table.get(handle), Ok(&entry.value));
                            assert_eq!(table.refs(handle), Ok(entry.refs));
                            *table.get_mut(handle).unwrap() += 1_000_000;
                            entry.value += 1_000_000;
                        }
                    }
                }
                _ => {
                    let mut expected: Vec<(u32, u64)> =
                        model.drain().map(|(raw, e)| (raw, e.value)).collect();
                    expected.sort_unstable_by_key(|&(raw, _)| raw & ((1 << table.index_bits) - 1));
                    let drained: Vec<(u32, u64)> = table
                        .drain()
                        .into_iter()
                        .map(|(h, v)| (h.raw(), v))
                        .collect();
                    assert_eq!(drained, expected);
                }
            }
            assert_eq!(table.len(), model.len());
            assert_eq!(table.bytes(), model.values().map(|e| e.bytes).sum::<u64>());
        }
    }
}

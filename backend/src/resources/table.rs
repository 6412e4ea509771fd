// Copyright 2026 The vrdma Authors
// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause

//! Per-guest handle tables.
//!
//! Guests name the host objects created on their behalf (PDs, MRs, CQs, QPs, SRQs, AHs) by
//! 32-bit opaque handles. Each guest has its own tables, so a handle from another guest is just
//! an unknown handle. A handle is a slot index plus a generation: once an object is removed, its
//! handle stays invalid even when the slot is reused, until the slot's generation counter wraps
//! around (at least 2^8 reuses of that very slot, far more for small tables). Handle 0 is never
//! issued.

use std::collections::VecDeque;
use std::fmt;

use super::kind::{ResourceError, ResourceKind, MAX_OBJECTS_PER_TABLE};
use super::quotas::Quotas;

/// A guest's name for one of its objects. Any 32-bit value can be looked up; tables never issue
/// 0, so 0 never names anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(u32);

impl Handle {
    /// The handle as received from the guest.
    pub const fn from_raw(raw: u32) -> Self {
        Handle(raw)
    }

    /// The handle as sent to the guest.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl From<Handle> for u32 {
    fn from(handle: Handle) -> u32 {
        handle.0
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    refs: u32,
    bytes: u64,
}

#[derive(Debug)]
struct Slot<T> {
    /// Generation of the current or, when empty, the last occupant; never 0.
    generation: u32,
    entry: Option<Entry<T>>,
}

/// A table of one kind of object, with O(1) insertion, lookup and removal.
///
/// Handles are `generation << index_bits | index`, where `index_bits` is just enough for the
/// table's limit, so small tables get more generation bits. Freed slots are reused oldest first,
/// which spreads reuse over all free slots and so delays generation wrap-around.
#[derive(Debug)]
pub struct HandleTable<T> {
    kind: ResourceKind,
    limit: u32,
    byte_limit: u64,
    index_bits: u32,
    max_generation: u32,
    slots: Vec<Slot<T>>,
    /// Empty slots, oldest first.
    free: VecDeque<u32>,
    len: u32,
    bytes: u64,
}

impl<T> HandleTable<T> {
    /// Creates a table of at most `limit` objects, without a byte limit.
    pub fn new(kind: ResourceKind, limit: u32) -> Result<Self, ResourceError> {
        Self::with_byte_limit(kind, limit, u64::MAX)
    }

    /// Creates a table of at most `limit` objects totalling at most `byte_limit` bytes.
    pub fn with_byte_limit(
        kind: ResourceKind,
        limit: u32,
        byte_limit: u64,
    ) -> Result<Self, ResourceError> {
        if limit > MAX_OBJECTS_PER_TABLE {
            return Err(ResourceError::LimitTooLarge { kind, limit });
        }
        let index_bits = u32::BITS - limit.saturating_sub(1).leading_zeros();
        let max_generation = u32::MAX >> index_bits;
        Ok(HandleTable {
            kind,
            limit,
            byte_limit,
            index_bits,
            max_generation,
            slots: Vec::new(),
            free: VecDeque::new(),
            len: 0,
            bytes: 0,
        })
    }

    /// Creates the table for `kind` with the limits of `quotas`.
    pub fn from_quotas(kind: ResourceKind, quotas: &Quotas) -> Result<Self, ResourceError> {
        Self::with_byte_limit(kind, quotas.count_limit(kind), quotas.byte_limit(kind))
    }

    /// Kind of the objects in the table.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }

    /// Maximum number of objects.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Maximum total bytes.
    pub fn byte_limit(&self) -> u64 {
        self.byte_limit
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the table holds no object.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total bytes accounted to live objects.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Checks that an object of `bytes` bytes would fit. Call it before creating the host object
    /// so that `insert` cannot fail afterwards.
    pub fn check_room(&self, bytes: u64) -> Result<(), ResourceError> {
        if self.len >= self.limit {
            return Err(ResourceError::Quota {
                kind: self.kind,
                limit: self.limit,
            });
        }
        match self.bytes.checked_add(bytes) {
            Some(total) if total <= self.byte_limit => Ok(()),
            _ => Err(ResourceError::ByteQuota {
                kind: self.kind,
                limit: self.byte_limit,
                used: self.bytes,
                requested: bytes,
            }),
        }
    }

    /// Adds an object that does not count against the byte limit.
    pub fn insert(&mut self, value: T) -> Result<Handle, ResourceError> {
        self.insert_with_bytes(value, 0)
    }

    /// Adds an object accounting `bytes` bytes against the byte limit. On a quota error the
    /// object is dropped: use [`check_room`](Self::check_room) first.
    pub fn insert_with_bytes(&mut self, value: T, bytes: u64) -> Result<Handle, ResourceError> {
        self.check_room(bytes)?;
        let entry = Entry {
            value,
            refs: 0,
            bytes,
        };
        let index = match self.free.pop_front() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = if slot.generation >= self.max_generation {
                    1
                } else {
                    slot.generation + 1
                };
                slot.entry = Some(entry);
                index
            }
            None => {
                // Fewer than `limit` objects live and no free slot: fewer than `limit` slots.
                let index = self.slots.len() as u32;
                self.slots.push(Slot {
                    generation: 1,
                    entry: Some(entry),
                });
                index
            }
        };
        self.len += 1;
        self.bytes += bytes;
        Ok(self.handle_of(index))
    }

    /// The object named by `handle`.
    pub fn get(&self, handle: Handle) -> Result<&T, ResourceError> {
        let index = self.find(handle)?;
        Ok(&self.entry(index).value)
    }

    /// The object named by `handle`, mutably.
    pub fn get_mut(&mut self, handle: Handle) -> Result<&mut T, ResourceError> {
        let index = self.find(handle)?;
        Ok(&mut self.entry_mut(index).value)
    }

    /// Whether `handle` names a live object.
    pub fn contains(&self, handle: Handle) -> bool {
        self.find(handle).is_ok()
    }

    /// Number of references held on the object named by `handle`.
    pub fn refs(&self, handle: Handle) -> Result<u32, ResourceError> {
        let index = self.find(handle)?;
        Ok(self.entry(index).refs)
    }

    /// Records that another object uses the object named by `handle` (e.g. an MR on its PD).
    pub fn acquire(&mut self, handle: Handle) -> Result<(), ResourceError> {
        let kind = self.kind;
        let index = self.find(handle)?;
        let entry = self.entry_mut(index);
        entry.refs = entry
            .refs
            .checked_add(1)
            .ok_or(ResourceError::TooManyRefs {
                kind,
                handle: handle.raw(),
            })?;
        Ok(())
    }

    /// Drops a reference taken with [`acquire`](Self::acquire).
    pub fn release(&mut self, handle: Handle) -> Result<(), ResourceError> {
        let kind = self.kind;
        let index = self.find(handle)?;
        let entry = self.entry_mut(index);
        entry.refs = entry
            .refs
            .checked_sub(1)
            .ok_or(ResourceError::NotReferenced {
                kind,
                handle: handle.raw(),
            })?;
        Ok(())
    }

    /// Removes and returns the object named by `handle`, for the caller to destroy; refused
    /// while other objects reference it.
    pub fn remove(&mut self, handle: Handle) -> Result<T, ResourceError> {
        let index = self.find(handle)?;
        let refs = self.entry(index).refs;
        if refs != 0 {
            return Err(ResourceError::Busy {
                kind: self.kind,
                handle: handle.raw(),
                refs,
            });
        }
        Ok(self.vacate(index).value)
    }

    /// Removes every object, ignoring references, in ascending handle index order. Meant for
    /// teardown: drain the tables in dependency order (e.g. QPs, SRQs, MRs, CQs, AHs, PDs).
    /// Handles issued before stay invalid.
    pub fn drain(&mut self) -> Vec<(Handle, T)> {
        let mut drained = Vec::with_capacity(self.len());
        for index in 0..self.slots.len() as u32 {
            if self.slots[index as usize].entry.is_some() {
                let handle = self.handle_of(index);
                drained.push((handle, self.vacate(index).value));
            }
        }
        drained
    }

    /// Live objects and their handles, in ascending handle index order.
    pub fn iter(&self) -> impl Iterator<Item = (Handle, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let entry = slot.entry.as_ref()?;
            Some((self.handle_of(index as u32), &entry.value))
        })
    }

    fn handle_of(&self, index: u32) -> Handle {
        let generation = self.slots[index as usize].generation;
        // index_bits <= 24 and generation <= u32::MAX >> index_bits: no bit is lost, and the
        // generation (never 0) keeps the handle from being 0.
        Handle((generation << self.index_bits) | index)
    }

    /// Index of the slot holding the live object named by `handle`.
    fn find(&self, handle: Handle) -> Result<u32, ResourceError> {
        let raw = handle.raw();
        let index = raw & ((1u32 << self.index_bits) - 1);
        let generation = raw >> self.index_bits;
        match self.slots.get(index as usize) {
            Some(slot) if slot.entry.is_some() && slot.generation == generation => Ok(index),
            _ => Err(ResourceError::BadHandle {
                kind: self.kind,
                handle: raw,
            }),
        }
    }

    fn entry(&self, index: u32) -> &Entry<T> {
        self.slots[index as usize]
            .entry
            .as_ref()
            .expect("find() returns occupied slots")
    }

    fn entry_mut(&mut self, index: u32) -> &mut Entry<T> {
        self.slots[index as usize]
            .entry
            .as_mut()
            .expect("find() returns occupied slots")
    }

    /// Empties an occupied slot and queues it for reuse.
    fn vacate(&mut self, index: u32) -> Entry<T> {
        let entry = self.slots[index as usize]
            .entry
            .take()
            .expect("vacate() is only called on occupied slots");
        self.len -= 1;
        self.bytes -= entry.bytes;
        self.free.push_back(index);
        entry
    }
}

#[cfg(test)]
mod tests;

//! Which context of the fake host device owns each host object, and every time a context named
//! an object that is not its own (another guest's, or one already destroyed): the fake host's
//! record of isolation, which tests and the handler fuzzer check.

use std::collections::BTreeMap;

/// The owning context of every live host object, by handle (handles are unique across all
/// contexts of one fake device, as uverbs object ids are across one device's files).
#[derive(Debug, Default)]
pub struct Ownership {
    next_context: u64,
    owners: BTreeMap<u32, u64>,
    /// Every command that named a handle its context does not own: command, handle, context.
    pub violations: Vec<(&'static str, u32, u64)>,
}

impl Ownership {
    /// A new context's number.
    pub(super) fn open_context(&mut self) -> u64 {
        self.next_context += 1;
        self.next_context
    }

    /// Number of contexts opened so far; the last one opened has this number.
    pub fn contexts_opened(&self) -> u64 {
        self.next_context
    }

    /// `context` created `handle`.
    pub(super) fn adopt(&mut self, context: u64, handle: u32) {
        self.owners.insert(handle, context);
    }

    /// `handle` is gone.
    pub(super) fn forget(&mut self, handle: u32) {
        self.owners.remove(&handle);
    }

    /// `context` named `handle` in `command`: recorded unless it owns the handle.
    pub(super) fn check(&mut self, context: u64, command: &'static str, handle: u32) {
        if self.owners.get(&handle) != Some(&context) {
            self.violations.push((command, handle, context));
        }
    }

    /// The owner of `handle`, if it is live.
    pub fn owner(&self, handle: u32) -> Option<u64> {
        self.owners.get(&handle).copied()
    }
}

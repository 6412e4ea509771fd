//! Wire structs of QUERY_GID_TABLE (spec §7.4): one populated GID entry with its index, and
//! the response body carrying up to [`GID_TABLE_BATCH`] of them.

use crate::Le32;

/// Entries in one QUERY_GID_TABLE response (the largest response stays QUERY_DEVICE's).
pub const GID_TABLE_BATCH: usize = 6;

/// `GidTableResp::next_index` when no populated entry follows the returned ones.
pub const GID_TABLE_END: u32 = u32::MAX;

wire_struct! {
    /// One populated GID table entry and its index: the index, then the fields of a QUERY_GID
    /// entry (`crate::wire::GidEntry`; `GidTableEntry::entry` and `GidTableEntry::new` convert).
    pub struct GidTableEntry {
        /// Table index.
        pub index: Le32,
        /// GID (network byte order).
        pub gid: [u8; 16],
        /// [`crate::verbs::GidType`].
        pub gid_type: Le32,
        /// `GID_FLAG_VALID` (always set in a returned entry).
        pub flags: Le32,
    }
}
assert_layout!(GidTableEntry, 28, index @ 0, gid @ 4, gid_type @ 20, flags @ 24);

wire_struct! {
    /// QUERY_GID_TABLE response body.
    pub struct GidTableResp {
        /// Entries used in `entries`, 0..=[`GID_TABLE_BATCH`], by increasing index.
        pub count: Le32,
        /// Where to continue (a request's `index`), or [`GID_TABLE_END`].
        pub next_index: Le32,
        /// `count` populated entries; the rest is zero.
        pub entries: [GidTableEntry; GID_TABLE_BATCH],
    }
}
assert_layout!(GidTableResp, 176, count @ 0, next_index @ 4, entries @ 8);

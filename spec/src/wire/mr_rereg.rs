//! Wire structs of REREG_MR (spec §7.4): the fixed request body and the response body.

use crate::{Le32, Le64};

wire_struct! {
    /// REREG_MR fixed body; with `CHANGE_TRANSLATION`, `npages` le64 page addresses follow it
    /// (the REG_MR page-list form).
    pub struct ReregMrReq {
        /// MR handle (stays the MR's handle).
        pub mr: Le32,
        /// [`crate::control::rereg_flags`]: at least one bit.
        pub flags: Le32,
        /// New PD handle with `CHANGE_PD`, else zero.
        pub pd: Le32,
        /// New access flags with `CHANGE_ACCESS`, else zero.
        pub access: Le32,
        /// New iova with `CHANGE_TRANSLATION`, else zero.
        pub iova: Le64,
        /// New length with `CHANGE_TRANSLATION` (>= 1), else zero.
        pub length: Le64,
        /// log2 of the page size of the page list with `CHANGE_TRANSLATION` (12..=30), else
        /// zero.
        pub page_shift: Le32,
        /// Number of page-list entries with `CHANGE_TRANSLATION`, else zero.
        pub npages: Le32,
    }
}
assert_layout!(ReregMrReq, 40, mr @ 0, flags @ 4, pd @ 8, access @ 12, iova @ 16,
    length @ 24, page_shift @ 32, npages @ 36);

wire_struct! {
    /// REREG_MR response body: the MR's keys after the change (they may differ from before).
    pub struct ReregMrResp {
        /// Local key for SGEs.
        pub lkey: Le32,
        /// Remote key for peers.
        pub rkey: Le32,
    }
}
assert_layout!(ReregMrResp, 8, lkey @ 0, rkey @ 4);

//! Control-queue commands: opcodes and header sizes ([`Opcode`]), requests
//! ([`ControlRequest`], with the page lists of REG_MR and REREG_MR) and responses ([`ControlResponse`]), each
//! with a panic-free decoder and an encoder, and the validation both share.

mod attr;
mod body;
mod cm;
mod mr_extents;
mod opcode;
mod reg_mr;
mod request;
mod rereg_mr;
mod response;

pub use attr::{check_ah_attr, check_qp_attr};
pub use cm::{check_cm_addr, CmRequest, CmResponseBody, CM_REJECT_REASONS};
pub use mr_extents::{
    check_extent, encode_extent_list, max_mr_extents, ExtentList, RegMrExtents, EXTENT_ENTRY_SIZE,
};
pub use opcode::{Opcode, HEADER_SIZE, MAX_CM_RESPONSE_SIZE, MAX_RESPONSE_SIZE};
pub use reg_mr::{
    check_mr_access, check_mr_span, check_page_address, check_reg_mr, encode_page_list, PageList,
    RegMr, MAX_PAGE_SHIFT, MIN_PAGE_SHIFT,
};
pub use request::ControlRequest;
pub use rereg_mr::{rereg_flags, ReregMr};
pub use response::{ControlResponse, ResponseBody};

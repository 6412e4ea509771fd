//! Typed access to the attribute wire structs of [`crate::wire`]: the one Rust form of QP and
//! address-handle attributes ([`qp`]) and of device, port and GID-table attributes ([`query`])
//! that the driver, the drop-in library and the device all use.

pub mod qp;
pub mod query;

#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod device;
pub mod handler;
pub mod listener;
pub mod mem;
pub mod resources;

#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod control;
pub mod device;
pub mod frontend_filter;
pub mod guest;
pub mod handler;
pub mod listener;
pub mod mem;
pub mod resources;
pub mod shm_alloc;

//! Test scenarios that run inside the rxe VM against a live vrdma-backend.

pub mod isolation;
pub mod process_pingpong;

//! Guest memory as the device uses it: the guest's RAM ([`guest_ram`]), the MR windows that map
//! it for the host RDMA device ([`mr_window`]), the placement of queue buffers in the queue
//! region ([`queue_region`]), the budgets of mappings and pinned memory MR
//! windows take from the host ([`budget`], [`pinned_extents`]). The staging file is the data
//! path's (`datapath::staging::file`).

pub mod budget;
pub mod error;
pub mod guest_ram;
mod mr_layout;
pub mod mr_window;
pub mod pinned_extents;
pub mod populated;
pub mod queue_region;
mod reservation;
#[cfg(test)]
mod test_files;

//! Tests of the virtio-pci driver against a small emulated device ([`fake_device`]), by topic.

mod fake_device;
mod sysfs;
mod transport;

//! The one layout rule of a descriptor chain that `virtio_queue`'s `Reader`/`Writer` do not
//! check: every device-readable descriptor comes before every device-writable one (virtio 1.2
//! §2.7.4.2, "the driver MUST place any device-writable descriptor elements after any
//! device-readable descriptor elements"). `Reader` and `Writer` each pick their own kind out of
//! the whole chain, so without this check a chain that interleaves them would be accepted, and
//! a request could be read from memory the driver announced as the device's to write.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::GuestMemory;

/// A chain whose layout breaks the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("device-readable descriptor {position} follows a device-writable one")]
pub struct ReadableAfterWritable {
    /// Position of the offending descriptor in the chain (0 is the head).
    pub position: usize,
}

/// Checks that no device-readable descriptor of `chain` follows a device-writable one.
/// Descriptors the chain cannot yield (a bad address or loop) end the walk: `Reader`/`Writer`
/// report those themselves.
pub fn check_order<M>(chain: &DescriptorChain<M>) -> Result<(), ReadableAfterWritable>
where
    M: Deref + Clone,
    M::Target: GuestMemory,
{
    let mut writable_seen = false;
    for (position, descriptor) in chain.clone().enumerate() {
        if descriptor.is_write_only() {
            writable_seen = true;
        } else if writable_seen {
            return Err(ReadableAfterWritable { position });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    const WRITE: u16 = virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE as u16;

    /// The order of a chain of descriptors, `true` for device-writable.
    fn order(writable: &[bool]) -> Result<(), ReadableAfterWritable> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap();
        let queue = MockSplitQueue::new(&mem, 16);
        let descriptors: Vec<RawDescriptor> = writable
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let flags = if w { WRITE } else { 0 };
                RawDescriptor::from(SplitDescriptor::new(
                    0x10_0000 + 0x100 * i as u64,
                    0x100,
                    flags,
                    0,
                ))
            })
            .collect();
        let chain = queue.build_desc_chain(&descriptors).unwrap();
        check_order(&chain)
    }

    #[test]
    fn readable_then_writable_is_the_only_accepted_order() {
        assert_eq!(order(&[false, true]), Ok(()));
        assert_eq!(order(&[false, false, true, true]), Ok(()));
        assert_eq!(order(&[false]), Ok(()));
        assert_eq!(order(&[true]), Ok(()));
        assert_eq!(
            order(&[true, false]),
            Err(ReadableAfterWritable { position: 1 })
        );
        assert_eq!(
            order(&[false, true, false, true]),
            Err(ReadableAfterWritable { position: 2 })
        );
    }
}

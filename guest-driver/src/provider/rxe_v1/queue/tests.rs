//! Tests of the rxe queue buffer, mapped (a local aligned buffer) and accessed (a logged
//! [`RegionAccess`] fake): geometry and header checks, slot addressing, index masking, and how
//! entries reach their slot.

use std::sync::Mutex;

use super::*;

/// A zeroed, page-aligned buffer standing in for a mapped queue.
struct Buffer {
    words: Vec<u64>,
}

impl Buffer {
    fn new(len: usize, log2: u32, mask: u32) -> Self {
        // A 64-byte aligned start is found inside a slightly larger allocation.
        let mut buf = Buffer {
            words: vec![0; len / 8 + 16],
        };
        let base = buf.base();
        // SAFETY: the header words lie inside the allocation (len >= 384 in every test).
        unsafe {
            base.as_ptr().cast::<u32>().write(log2);
            base.as_ptr().cast::<u32>().add(1).write(mask);
        }
        buf
    }

    fn base(&mut self) -> NonNull<u8> {
        let ptr = self.words.as_mut_ptr().cast::<u8>();
        let skip = ptr.align_offset(BASE_ALIGN);
        // SAFETY: `skip` < 64 bytes, within the 128 spare bytes of the allocation.
        NonNull::new(unsafe { ptr.add(skip) }).unwrap()
    }
}

/// One access to a [`VecRegion`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Access {
    Read { offset: u64, len: usize },
    Write { offset: u64, len: usize },
    Load { offset: u64 },
    Store { offset: u64, value: u32 },
}

/// A region that is not mapped: bytes behind a lock, every access logged.
struct VecRegion {
    bytes: Mutex<Vec<u8>>,
    log: Mutex<Vec<Access>>,
}

impl VecRegion {
    fn new(len: usize) -> Arc<Self> {
        Arc::new(VecRegion {
            bytes: Mutex::new(vec![0; len]),
            log: Mutex::new(Vec::new()),
        })
    }

    /// A region of `len` bytes holding a queue header at `offset`.
    fn with_header(len: usize, offset: usize, log2: u32, mask: u32) -> Arc<Self> {
        let region = Self::new(len);
        region.poke(offset, &log2.to_le_bytes());
        region.poke(offset + 4, &mask.to_le_bytes());
        region
    }

    fn poke(&self, offset: usize, data: &[u8]) {
        self.bytes.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
    }

    fn peek(&self, offset: usize, len: usize) -> Vec<u8> {
        self.bytes.lock().unwrap()[offset..offset + len].to_vec()
    }

    fn take_log(&self) -> Vec<Access> {
        std::mem::take(&mut self.log.lock().unwrap())
    }

    /// The byte range of an access, refusing (failing the test) anything outside.
    fn range(&self, offset: u64, len: usize) -> std::ops::Range<usize> {
        let start = offset as usize;
        let end = self.bytes.lock().unwrap().len();
        assert!(
            start <= end && len <= end - start,
            "access {start}+{len} outside"
        );
        start..start + len
    }
}

impl RegionAccess for VecRegion {
    fn read(&self, offset: u64, buf: &mut [u8]) {
        let range = self.range(offset, buf.len());
        buf.copy_from_slice(&self.bytes.lock().unwrap()[range]);
        let len = buf.len();
        self.log.lock().unwrap().push(Access::Read { offset, len });
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let range = self.range(offset, data.len());
        self.bytes.lock().unwrap()[range].copy_from_slice(data);
        let len = data.len();
        self.log.lock().unwrap().push(Access::Write { offset, len });
    }

    fn load_u32(&self, offset: u64) -> u32 {
        assert!(offset.is_multiple_of(4));
        let range = self.range(offset, 4);
        let word = self.bytes.lock().unwrap()[range].try_into().unwrap();
        self.log.lock().unwrap().push(Access::Load { offset });
        u32::from_le_bytes(word)
    }

    fn store_u32(&self, offset: u64, value: u32) {
        assert!(offset.is_multiple_of(4));
        let range = self.range(offset, 4);
        self.bytes.lock().unwrap()[range].copy_from_slice(&value.to_le_bytes());
        self.log
            .lock()
            .unwrap()
            .push(Access::Store { offset, value });
    }
}

fn geometry(num_slots: u32, log2_slot_size: u32) -> RingGeometry {
    RingGeometry::new(num_slots, log2_slot_size).unwrap()
}

/// Where the accessed queues of these tests start in their region.
const AT: usize = 4096;

#[test]
fn accepts_consistent_header_and_addresses_slots_masked() {
    let len = 384 + 8 * 128;
    let mut buf = Buffer::new(len, 7, 7);
    // SAFETY: the buffer outlives the queue and is accessed only through it.
    let mapped = unsafe { RxeQueue::new(buf.base(), len, geometry(8, 7)) }.unwrap();
    let region = VecRegion::with_header(AT + len, AT, 7, 7);
    let accessed = RxeQueue::accessed(region.clone(), AT, len, geometry(8, 7)).unwrap();
    assert!(mapped.is_mapped() && !accessed.is_mapped());
    for q in [mapped, accessed] {
        assert_eq!((q.num_slots(), q.capacity(), q.slot_size()), (8, 7, 128));
        assert_eq!(q.slot_offset(0), 384);
        assert_eq!(q.slot_offset(7), 384 + 7 * 128);
        assert_eq!(q.slot_offset(8), 384);
        assert_eq!(q.slot_offset(u32::MAX), 384 + 7 * 128);
        assert_eq!(q.next(7), 0);
    }
    // The header checks read through the accessor, at the queue's offset.
    let log = region.take_log();
    assert_eq!(
        log,
        [
            Access::Load { offset: 4096 },
            Access::Load { offset: 4100 },
            Access::Load { offset: 4096 + 128 },
            Access::Load { offset: 4096 + 256 },
        ]
    );
}

#[test]
fn refuses_inconsistent_geometry() {
    let len = 384 + 8 * 128;
    let cases = [
        (
            (7, 7),
            len,
            geometry(8, 6),
            GeometryError::HeaderMismatch { log2: 7, mask: 7 },
        ),
        (
            (7, 15),
            len,
            geometry(8, 7),
            GeometryError::HeaderMismatch { log2: 7, mask: 15 },
        ),
        (
            (7, 7),
            len - 1,
            geometry(8, 7),
            GeometryError::TooSmall {
                need: len as u64,
                mapped: len - 1,
            },
        ),
        (
            (7, 7),
            len,
            geometry(1 << 31, 16),
            GeometryError::TooSmall {
                need: 384 + (1 << 47),
                mapped: len,
            },
        ),
    ];
    for ((log2, mask), claimed, geometry, want) in cases {
        let mut buf = Buffer::new(len, log2, mask);
        // SAFETY: the buffer outlives the (refused) queue.
        let got = unsafe { RxeQueue::new(buf.base(), claimed, geometry) }.unwrap_err();
        assert_eq!(got, want);
        let region = VecRegion::with_header(AT + len, AT, log2, mask);
        let got = RxeQueue::accessed(region, AT, claimed, geometry).unwrap_err();
        assert_eq!(got, want);
    }
}

#[test]
fn refuses_out_of_range_indices_and_misalignment() {
    let len = 384 + 8 * 128;
    let mut buf = Buffer::new(len, 7, 7);
    let base = buf.base();
    // SAFETY: offset 128 is the producer word, inside the buffer.
    unsafe { base.as_ptr().add(128).cast::<u32>().write(8) };
    // SAFETY: the buffer outlives the (refused) queue.
    let got = unsafe { RxeQueue::new(base, len, geometry(8, 7)) }.unwrap_err();
    let want = GeometryError::IndexOutOfRange {
        which: "producer",
        value: 8,
    };
    assert_eq!(got, want);
    let region = VecRegion::with_header(AT + len, AT, 7, 7);
    region.poke(AT + 128, &8u32.to_le_bytes());
    let got = RxeQueue::accessed(region, AT, len, geometry(8, 7)).unwrap_err();
    assert_eq!(got, want);

    // SAFETY: 8 bytes past the start is still inside the allocation (64 spare bytes).
    let odd = unsafe { NonNull::new_unchecked(base.as_ptr().add(8)) };
    // SAFETY: as above; the queue is refused before any access.
    let got = unsafe { RxeQueue::new(odd, len, geometry(8, 7)) }.unwrap_err();
    assert_eq!(got, GeometryError::Misaligned(odd.as_ptr() as usize));

    let region = VecRegion::with_header(AT + 8 + len, AT + 8, 7, 7);
    let got = RxeQueue::accessed(region.clone(), AT + 8, len, geometry(8, 7)).unwrap_err();
    assert_eq!(got, GeometryError::Misaligned(AT + 8));
    let far = usize::MAX & !63;
    let got = RxeQueue::accessed(region.clone(), far, len, geometry(8, 7)).unwrap_err();
    assert_eq!(got, GeometryError::OffsetOverflow { offset: far, len });
    assert_eq!(region.take_log(), [], "refused before any access");
}

#[test]
fn mapped_entries_are_built_in_place() {
    let len = 384 + 4 * 64;
    let mut buf = Buffer::new(len, 6, 3);
    let base = buf.base();
    // SAFETY: the buffer outlives the queue and is accessed only through it.
    let mut q = unsafe { RxeQueue::new(base, len, geometry(4, 6)) }.unwrap();
    // SAFETY: nothing plays the other side of this queue.
    let mut entry = unsafe { q.slot_writer(5) };
    entry.put(8, 0x1122_3344_5566_7788u64);
    let src = *b"inline";
    // SAFETY: `src` is a live local array.
    unsafe { entry.put_bytes(58, src.as_ptr(), src.len()) };
    // Built in place: the slot holds the bytes before the (no-op) commit.
    let slot = base.as_ptr().wrapping_add(384 + 64);
    // SAFETY: the slot lies inside the buffer.
    let bytes = unsafe { std::slice::from_raw_parts(slot, 64) }.to_vec();
    entry.commit(64);
    assert_eq!(bytes[8..16], 0x1122_3344_5566_7788u64.to_ne_bytes());
    assert_eq!(bytes[58..64], src);
    // Read in place: what the other side writes is what comes back.
    // SAFETY: the slot lies inside the buffer and is 64-byte aligned.
    unsafe { slot.cast::<u64>().write(0x0102_0304_0506_0708) };
    // SAFETY: nothing plays the other side of this queue.
    let word: u64 = unsafe { q.read_slot(9) };
    assert_eq!(word, 0x0102_0304_0506_0708);
}

#[test]
fn accessed_entries_are_built_in_scratch_and_written_once() {
    let len = 384 + 4 * 64;
    let region = VecRegion::with_header(AT + len, AT, 6, 3);
    let mut q = RxeQueue::accessed(region.clone(), AT, len, geometry(4, 6)).unwrap();
    region.take_log();
    // SAFETY: nothing plays the other side of this queue.
    let mut entry = unsafe { q.slot_writer(5) };
    entry.put(0, 0xaabb_ccddu32);
    entry.put(8, 0x1122_3344_5566_7788u64);
    let src = *b"inline";
    // SAFETY: `src` is a live local array.
    unsafe { entry.put_bytes(58, src.as_ptr(), src.len()) };
    assert_eq!(
        region.take_log(),
        [],
        "nothing reaches the region before commit"
    );
    entry.commit(64);
    let slot = AT + 384 + 64;
    assert_eq!(
        region.take_log(),
        [Access::Write {
            offset: slot as u64,
            len: 64
        }]
    );
    let bytes = region.peek(slot, 64);
    assert_eq!(bytes[0..4], 0xaabb_ccddu32.to_ne_bytes());
    assert_eq!(bytes[8..16], 0x1122_3344_5566_7788u64.to_ne_bytes());
    assert_eq!(bytes[58..64], src);
    assert_eq!(region.peek(slot - 64, 64), [0; 64], "neighbour untouched");

    // A shorter entry writes only its own bytes.
    // SAFETY: as above.
    let mut entry = unsafe { q.slot_writer(2) };
    entry.put(0, 7u32);
    entry.commit(4);
    assert_eq!(
        region.take_log(),
        [Access::Write {
            offset: (AT + 384 + 128) as u64,
            len: 4
        }]
    );

    // Reading goes through the scratch with one read of the entry's size.
    region.poke(slot, &0x0102_0304_0506_0708u64.to_ne_bytes());
    // SAFETY: as above.
    let got: [u64; 2] = [unsafe { q.read_slot(5) }, unsafe { q.read_slot(9) }];
    assert_eq!(got, [0x0102_0304_0506_0708; 2]);
    // SAFETY: as above.
    let word: u32 = unsafe { q.read_slot(2) };
    assert_eq!(word, 7);
    let read = |offset: usize, len| Access::Read {
        offset: offset as u64,
        len,
    };
    assert_eq!(
        region.take_log(),
        [read(slot, 8), read(slot, 8), read(AT + 384 + 128, 4)]
    );
}

#[test]
fn indices_are_masked_both_ways() {
    let len = 384 + 4 * 64;
    let mut buf = Buffer::new(len, 6, 3);
    // SAFETY: the buffer outlives the queue and is accessed only through it.
    let mapped = unsafe { RxeQueue::new(buf.base(), len, geometry(4, 6)) }.unwrap();
    let region = VecRegion::with_header(AT + len, AT, 6, 3);
    let accessed = RxeQueue::accessed(region.clone(), AT, len, geometry(4, 6)).unwrap();
    for q in [&mapped, &accessed] {
        q.store_producer(0xffff_fff6, Ordering::Release);
        q.store_consumer(5, Ordering::Release);
        assert_eq!(q.load_producer(Ordering::Acquire), 2);
        assert_eq!(q.load_consumer(Ordering::Acquire), 1);
    }
    // What the other side wrote is masked on the way in, too.
    region.poke(AT + 128, &0xdead_beefu32.to_le_bytes());
    assert_eq!(accessed.load_producer(Ordering::Acquire), 0xf & 3);
    region.take_log();
    accessed.store_consumer(0xffff_ffff, Ordering::Release);
    assert_eq!(
        region.take_log(),
        [Access::Store {
            offset: (AT + 256) as u64,
            value: 3
        }]
    );
}

#[test]
#[should_panic(expected = "outside a slot")]
fn accessed_writer_refuses_bytes_past_the_slot() {
    let len = 384 + 2 * 64;
    let region = VecRegion::with_header(AT + len, AT, 6, 1);
    let mut q = RxeQueue::accessed(region, AT, len, geometry(2, 6)).unwrap();
    // SAFETY: nothing plays the other side of this queue.
    let mut entry = unsafe { q.slot_writer(1) };
    entry.put(60, 0u64);
}

#[test]
#[should_panic(expected = "outside a slot")]
fn mapped_writer_refuses_bytes_past_the_slot() {
    let len = 384 + 2 * 64;
    let mut buf = Buffer::new(len, 6, 1);
    // SAFETY: the buffer outlives the queue and is accessed only through it.
    let mut q = unsafe { RxeQueue::new(buf.base(), len, geometry(2, 6)) }.unwrap();
    // SAFETY: nothing plays the other side of this queue.
    let mut entry = unsafe { q.slot_writer(1) };
    let src = [0u8; 8];
    // SAFETY: `src` is a live local array.
    unsafe { entry.put_bytes(57, src.as_ptr(), src.len()) };
}

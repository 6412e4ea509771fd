//! A simulated Soft-RoCE kernel for the guest provider's rxe v1 queues: queue buffers in
//! ordinary memory, each ending right before an inaccessible guard page (an access past its
//! end crashes the test instead of going unnoticed), with the kernel's side of the queue played
//! by the test (in another thread where it matters), reading WQEs and writing CQEs with the same
//! index protocol as `rdma_rxe`.
//!
//! The provider reaches a queue either mapped into its address space or only through a
//! [`RegionAccess`] (as under qtest); [`TestRegion`] is that accessor, and counts and can log
//! every access. [`for_both_reaches!`](crate::for_both_reaches) runs a test both ways.

use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vrdma::provider::rxe_v1::RxeQueue;
use vrdma::provider::Sge;
use vrdma::transport::RegionAccess;
use vrdma_spec::rxe_v1::{
    header, GeometryError, IbUverbsWc, RingGeometry, RxeRecvWqe, RxeSendWqe, RxeSge,
};
use vrdma_spec::{Le32, Le64};

/// How long a simulated kernel (or a test waiting for it) waits for progress before failing.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Written into the kernel-owned WQE fields by [`KernelSide::mark_kernel_owned`]: the provider
/// must leave them alone.
pub const KERNEL_OWNED: u32 = 0xa5a5_a5a5;

/// How the provider reaches a queue buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Mapped into its address space.
    Mapped,
    /// Only through a [`RegionAccess`].
    Accessed,
}

/// A queue buffer with a correct header, placed so that it ends at a `PROT_NONE` page.
pub struct SharedQueue {
    map: *mut libc::c_void,
    map_len: usize,
    kernel: KernelSide,
    len: usize,
    reach: Reach,
    /// The mapping up to the guard page as a region the provider reaches through accesses;
    /// the queue sits at its end.
    region: Arc<TestRegion>,
}

impl SharedQueue {
    /// A queue of `num_slots` slots of `1 << log2_slot_size` bytes, reached as `reach` says.
    pub fn new(reach: Reach, num_slots: u32, log2_slot_size: u32) -> Self {
        Self::with_header(
            reach,
            num_slots,
            log2_slot_size,
            log2_slot_size,
            num_slots - 1,
        )
    }

    /// Like [`Self::new`], but with `header_log2` and `header_mask` written into the header
    /// instead of the real geometry (a corrupted header).
    pub fn with_header(
        reach: Reach,
        num_slots: u32,
        log2_slot_size: u32,
        header_log2: u32,
        header_mask: u32,
    ) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let geometry = RingGeometry::new(num_slots, log2_slot_size).unwrap();
        let len = geometry.buffer_len() as usize;
        let data_pages = len.div_ceil(page);
        let map_len = (data_pages + 1) * page;
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let guard = map as usize + data_pages * page;
        // SAFETY: the last page belongs to the mapping created above.
        let rc = unsafe { libc::mprotect(guard as *mut libc::c_void, page, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        // `len` is a multiple of 64, so the base is 64-byte aligned.
        let base = NonNull::new((guard - len) as *mut u8).unwrap();
        let kernel = KernelSide { base, geometry };
        // SAFETY: the two header words lie in the writable part of the mapping.
        unsafe {
            base.as_ptr().cast::<u32>().write(header_log2);
            base.as_ptr().cast::<u32>().add(1).write(header_mask);
        }
        let region = Arc::new(TestRegion {
            base: NonNull::new(map.cast()).unwrap(),
            len: data_pages * page,
            counts: AtomicCounts::default(),
            log: Mutex::new(None),
        });
        SharedQueue {
            map,
            map_len,
            kernel,
            len,
            reach,
            region,
        }
    }

    /// The kernel's view of the queue.
    pub fn kernel(&self) -> KernelSide {
        self.kernel
    }

    /// Bytes of header and slots.
    pub fn buffer_len(&self) -> usize {
        self.len
    }

    /// The accessor a [`Reach::Accessed`] queue goes through; it counts and logs only what
    /// goes through it.
    pub fn region(&self) -> &TestRegion {
        &self.region
    }

    /// The geometry the device would report for the queue.
    pub fn geometry(&self) -> RingGeometry {
        self.kernel.geometry
    }

    /// The queue as the provider sees it, claiming `geometry` and `len` bytes.
    pub fn queue_claiming(
        &self,
        len: usize,
        geometry: RingGeometry,
    ) -> Result<RxeQueue, GeometryError> {
        match self.reach {
            // SAFETY: the buffer stays mapped until `self` is dropped, after every queue built
            // on it in these tests (refused claims are refused before any access); the test
            // plays the kernel through `KernelSide` only.
            Reach::Mapped => unsafe { RxeQueue::new(self.kernel.base, len, geometry) },
            Reach::Accessed => {
                let offset = self.kernel.base.as_ptr() as usize - self.map as usize;
                let queue = RxeQueue::accessed(self.region.clone(), offset, len, geometry);
                if let Ok(queue) = &queue {
                    assert!(!queue.is_mapped());
                }
                queue
            }
        }
    }

    /// The queue as the provider sees it, claiming the real geometry and length.
    pub fn try_queue(&self) -> Result<RxeQueue, GeometryError> {
        self.queue_claiming(self.len, self.geometry())
    }

    /// [`Self::try_queue`], which must succeed.
    pub fn queue(&self) -> RxeQueue {
        self.try_queue().unwrap()
    }

    /// Offset of slot `index` in the region.
    pub fn slot_offset(&self, index: u32) -> u64 {
        (self.kernel.slot(index) as usize - self.map as usize) as u64
    }

    /// Offset of the producer (128) or consumer (256) index word in the region.
    pub fn word_offset(&self, word: usize) -> u64 {
        (self.kernel.base.as_ptr() as usize + word - self.map as usize) as u64
    }
}

/// One access the provider made to a [`TestRegion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// [`RegionAccess::read`] of `len` bytes at `offset`.
    Read {
        /// Region offset.
        offset: u64,
        /// Bytes read.
        len: usize,
    },
    /// [`RegionAccess::write`] of `len` bytes at `offset`.
    Write {
        /// Region offset.
        offset: u64,
        /// Bytes written.
        len: usize,
    },
    /// [`RegionAccess::load_u32`] (Acquire) at `offset`.
    Load {
        /// Region offset.
        offset: u64,
    },
    /// [`RegionAccess::store_u32`] (Release) of `value` at `offset`.
    Store {
        /// Region offset.
        offset: u64,
        /// The value stored.
        value: u32,
    },
}

/// How many accesses of each kind a [`TestRegion`] served so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// [`RegionAccess::read`] calls.
    pub reads: usize,
    /// [`RegionAccess::write`] calls.
    pub writes: usize,
    /// [`RegionAccess::load_u32`] calls.
    pub loads: usize,
    /// [`RegionAccess::store_u32`] calls.
    pub stores: usize,
}

/// The live counters behind [`Counts`].
#[derive(Default)]
struct AtomicCounts {
    reads: AtomicUsize,
    writes: AtomicUsize,
    loads: AtomicUsize,
    stores: AtomicUsize,
}

/// The provider's way to a [`SharedQueue`] that it does not map: bounds-checked copies and
/// atomic index accesses on the mapping, counted, and logged while logging is on.
pub struct TestRegion {
    base: NonNull<u8>,
    len: usize,
    counts: AtomicCounts,
    log: Mutex<Option<Vec<Access>>>,
}

// SAFETY: the region is only a pointer into a `SharedQueue` mapping that outlives every queue
// and thread using it in these tests; it is accessed with copies that follow the queue
// protocol and with atomics, like the kernel side.
unsafe impl Send for TestRegion {}
// SAFETY: as for Send; the counters and the log are thread-safe.
unsafe impl Sync for TestRegion {}

impl TestRegion {
    /// Starts logging accesses (with an empty log).
    pub fn start_log(&self) {
        *self.log.lock().unwrap() = Some(Vec::new());
    }

    /// The accesses since the last `start_log` or `take_log`; logging stays on.
    pub fn take_log(&self) -> Vec<Access> {
        self.log
            .lock()
            .unwrap()
            .replace(Vec::new())
            .expect("logging was not started")
    }

    /// How many accesses of each kind the region served so far.
    pub fn counts(&self) -> Counts {
        let c = &self.counts;
        Counts {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            loads: c.loads.load(Ordering::Relaxed),
            stores: c.stores.load(Ordering::Relaxed),
        }
    }

    fn record(&self, counter: &AtomicUsize, access: Access) {
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = self.log.lock().unwrap().as_mut() {
            log.push(access);
        }
    }

    /// Address of `len` bytes at `offset`, failing the test if they leave the region.
    fn at(&self, offset: u64, len: usize) -> *mut u8 {
        let offset = offset as usize;
        assert!(
            offset <= self.len && len <= self.len - offset,
            "access {offset:#x}+{len} outside the region"
        );
        self.base.as_ptr().wrapping_add(offset)
    }

    fn word(&self, offset: u64) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4),
            "unaligned index access {offset:#x}"
        );
        // SAFETY: inside the region (checked by `at`) and 4-byte aligned (the mapping is
        // page-aligned); both sides access index words only atomically.
        unsafe { AtomicU32::from_ptr(self.at(offset, 4).cast()) }
    }
}

impl RegionAccess for TestRegion {
    fn read(&self, offset: u64, buf: &mut [u8]) {
        let src = self.at(offset, buf.len());
        // SAFETY: inside the region (checked); the queue protocol keeps the kernel side off
        // these bytes while the provider reads them.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) };
        let len = buf.len();
        self.record(&self.counts.reads, Access::Read { offset, len });
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let dst = self.at(offset, data.len());
        // SAFETY: inside the region (checked); the queue protocol keeps the kernel side off
        // these bytes while the provider writes them.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        let len = data.len();
        self.record(&self.counts.writes, Access::Write { offset, len });
    }

    fn load_u32(&self, offset: u64) -> u32 {
        let value = self.word(offset).load(Ordering::Acquire);
        self.record(&self.counts.loads, Access::Load { offset });
        value
    }

    fn store_u32(&self, offset: u64, value: u32) {
        self.word(offset).store(value, Ordering::Release);
        self.record(&self.counts.stores, Access::Store { offset, value });
    }
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `with_header`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The kernel's view of a queue buffer: the header words as atomics, slots as raw memory.
#[derive(Clone, Copy)]
pub struct KernelSide {
    base: NonNull<u8>,
    geometry: RingGeometry,
}

// SAFETY: the handle is only a pointer into a `SharedQueue` that outlives every thread using
// it (scoped threads); the indices are accessed atomically and slots according to the queue
// protocol, as the kernel does.
unsafe impl Send for KernelSide {}

impl KernelSide {
    fn index_word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the header word lies in the mapping, is aligned, and both sides use atomics.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// The producer index word.
    pub fn producer(&self) -> &AtomicU32 {
        self.index_word(header::PRODUCER_INDEX)
    }

    /// The consumer index word.
    pub fn consumer(&self) -> &AtomicU32 {
        self.index_word(header::CONSUMER_INDEX)
    }

    /// Number of slots minus one.
    pub fn mask(&self) -> u32 {
        self.geometry.index_mask()
    }

    /// The start of slot `index` (masked).
    pub fn slot(&self, index: u32) -> *mut u8 {
        let offset = self.geometry.slot_offset(index);
        // SAFETY: a masked index names a slot inside the mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// The send WQE in slot `index` (masked).
    pub fn send_wqe(&self, index: u32) -> RxeSendWqe {
        // SAFETY: aligned slot inside the mapping, owned by the kernel side right now.
        unsafe { self.slot(index).cast::<RxeSendWqe>().read() }
    }

    /// The receive WQE in slot `index` (masked).
    pub fn recv_wqe(&self, index: u32) -> RxeRecvWqe {
        // SAFETY: as in `send_wqe`.
        unsafe { self.slot(index).cast::<RxeRecvWqe>().read() }
    }

    /// The SGE array (or inline bytes, as `len` bytes) after a WQE of `header` bytes.
    pub fn payload(&self, index: u32, header: usize, len: usize) -> Vec<u8> {
        assert!(header + len <= self.geometry.slot_size());
        // SAFETY: the range lies inside the slot (asserted).
        unsafe { std::slice::from_raw_parts(self.slot(index).add(header), len).to_vec() }
    }

    /// The `n` SGEs after a WQE of `header` bytes in slot `index` (masked).
    pub fn sges(&self, index: u32, header: usize, n: usize) -> Vec<RxeSge> {
        let bytes = self.payload(index, header, n * size_of::<RxeSge>());
        bytes
            .chunks(16)
            .map(|c| RxeSge {
                addr: Le64::from_bytes(c[0..8].try_into().unwrap()),
                length: Le32::from_bytes(c[8..12].try_into().unwrap()),
                lkey: Le32::from_bytes(c[12..16].try_into().unwrap()),
            })
            .collect()
    }

    /// Fills the kernel-owned fields of every send slot with [`KERNEL_OWNED`].
    pub fn mark_kernel_owned(&self) {
        for i in 0..=self.geometry.index_mask() {
            let wqe = self.slot(i).cast::<RxeSendWqe>();
            let owned = Le32::new(KERNEL_OWNED);
            // SAFETY: fields (alignment 1) of a slot inside the mapping; nothing is posted yet.
            unsafe {
                (&raw mut (*wqe).status).write(owned);
                (&raw mut (*wqe).state).write(owned);
                (&raw mut (*wqe).mask).write(owned);
                (&raw mut (*wqe).first_psn).write(owned);
                (&raw mut (*wqe).last_psn).write(owned);
                (&raw mut (*wqe).ack_length).write(owned);
                (&raw mut (*wqe).ssn).write(owned);
                (&raw mut (*wqe).has_rd_atomic).write(owned);
            }
        }
    }

    /// Zeroes the whole buffer, header included, as when the device's back-end is lost and
    /// its mapping replaced by fresh anonymous memory.
    pub fn replace_with_zeros(&self) {
        let len = usize::try_from(self.geometry.buffer_len()).expect("buffer fits in memory");
        // SAFETY: the buffer lies in the mapping; the test owns both sides of the queue, and
        // the index words are only accessed atomically elsewhere (a zeroing store is a plain
        // write the test orders by joining or by sequencing on one thread).
        unsafe { std::ptr::write_bytes(self.base.as_ptr(), 0, len) }
    }

    /// Writes `cqe` into slot `index` (masked) of a CQ.
    pub fn write_cqe(&self, index: u32, cqe: IbUverbsWc) {
        // SAFETY: aligned slot inside the mapping, owned by the kernel side (producer slot).
        unsafe { self.slot(index).cast::<IbUverbsWc>().write(cqe) }
    }
}

/// The SGEs the kernel should find in a WQE for `sges`.
pub fn rxe_sges(sges: &[Sge]) -> Vec<RxeSge> {
    sges.iter()
        .map(|s| RxeSge {
            addr: Le64::new(s.addr),
            length: Le32::new(s.length),
            lkey: Le32::new(s.lkey),
        })
        .collect()
}

/// An SGE over `buf` with `lkey`.
pub fn sge_of(buf: &[u8], lkey: u32) -> Sge {
    Sge {
        addr: buf.as_ptr() as u64,
        length: buf.len() as u32,
        lkey,
    }
}

/// Plays the kernel for `total` send WQEs, with `rdma_rxe`'s index protocol: waits for each
/// WQE the provider publishes in `sq` (Acquire load of the producer index), hands its number
/// (from 0) and slot index to `execute`, which checks it and returns the completion to write,
/// if any; writes that CQE into `cq` once the CQ has room (one slot always stays empty) and
/// publishes it (Release store of the CQ producer index); then hands the slot back (Release
/// store of the SQ consumer index). Fails if the provider stops making progress for
/// [`DEADLINE`].
pub fn complete_sends(
    sq: KernelSide,
    cq: KernelSide,
    total: u64,
    mut execute: impl FnMut(u64, &KernelSide, u32) -> Option<IbUverbsWc>,
) {
    let deadline = Instant::now() + DEADLINE;
    let mut sq_cons = 0u32;
    let mut cq_prod = 0u32;
    let mut i = 0u64;
    while i < total {
        assert!(Instant::now() < deadline, "kernel: stuck at WQE {i}");
        let sq_prod = sq.producer().load(Ordering::Acquire);
        if sq_prod == sq_cons {
            thread::yield_now();
            continue;
        }
        if let Some(cqe) = execute(i, &sq, sq_cons) {
            while cq.geometry.next(cq_prod) == cq.consumer().load(Ordering::Acquire) {
                assert!(Instant::now() < deadline, "kernel: CQ never drained");
                thread::yield_now();
            }
            cq.write_cqe(cq_prod, cqe);
            cq_prod = cq.geometry.next(cq_prod);
            cq.producer().store(cq_prod, Ordering::Release);
        }
        sq_cons = sq.geometry.next(sq_cons);
        sq.consumer().store(sq_cons, Ordering::Release);
        i += 1;
    }
}

/// Runs each named test function (taking a [`Reach`]) once per reach, as `mapped::name` and
/// `accessed::name`.
#[macro_export]
macro_rules! for_both_reaches {
    ($($test:ident),+ $(,)?) => {
        mod mapped {
            $(
                #[test]
                fn $test() {
                    super::$test($crate::rxe_kernel_sim::Reach::Mapped);
                }
            )+
        }

        mod accessed {
            $(
                #[test]
                fn $test() {
                    super::$test($crate::rxe_kernel_sim::Reach::Accessed);
                }
            )+
        }
    };
}

//! The rxe v1 provider against a simulated Soft-RoCE kernel: queue buffers in ordinary memory,
//! the kernel's side played by this test (in another thread where it matters), reading WQEs
//! and writing CQEs with the same index protocol as `rdma_rxe`.
//!
//! Every queue ends right before an inaccessible guard page, so an access past its end crashes
//! the test instead of going unnoticed.
//!
//! Each test runs twice: with the queue mapped into the provider's address space, and with the
//! provider reaching it only through a [`RegionAccess`] (as under qtest), which counts and can
//! log every access.

use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vrdma::provider::rxe_v1::{
    CompletionQueue, QueueError, QueueGeometry, RecvQueue, RxeAddressHandle, RxeQueue, SendQueue,
    SendQueueCaps,
};
use vrdma::provider::{
    PostError, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};
use vrdma::transport::RegionAccess;
use vrdma_spec::rxe_v1::{IbUverbsWc, RxeAv, RxeRecvWqe, RxeSendWqe, RxeSge};
use vrdma_spec::{Le16, Le32, Le64};
use zerocopy::{FromZeros, IntoBytes};

const HEADER: usize = 384;
const DEADLINE: Duration = Duration::from_secs(60);
/// Written into the kernel-owned WQE fields before posting: the provider must leave them alone.
const KERNEL_OWNED: u32 = 0xa5a5_a5a5;

/// How the provider reaches a queue buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Mapped into its address space.
    Mapped,
    /// Only through a [`RegionAccess`].
    Accessed,
}

/// A queue buffer with a correct header, placed so that it ends at a `PROT_NONE` page.
struct SharedQueue {
    map: *mut libc::c_void,
    map_len: usize,
    kernel: KernelSide,
    len: usize,
    kind: Kind,
    /// The mapping up to the guard page as a region the provider reaches through accesses;
    /// the queue sits at its end.
    region: Arc<TestRegion>,
}

impl SharedQueue {
    fn new(kind: Kind, num_slots: u32, log2_slot_size: u32) -> Self {
        Self::with_header(
            kind,
            num_slots,
            log2_slot_size,
            log2_slot_size,
            num_slots - 1,
        )
    }

    fn with_header(
        kind: Kind,
        num_slots: u32,
        log2_slot_size: u32,
        header_log2: u32,
        header_mask: u32,
    ) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = HEADER + ((num_slots as usize) << log2_slot_size);
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
        let kernel = KernelSide {
            base,
            mask: num_slots - 1,
            log2: log2_slot_size,
        };
        // SAFETY: the two header words lie in the writable part of the mapping.
        unsafe {
            base.as_ptr().cast::<u32>().write(header_log2);
            base.as_ptr().cast::<u32>().add(1).write(header_mask);
        }
        let region = Arc::new(TestRegion {
            base: NonNull::new(map.cast()).unwrap(),
            len: data_pages * page,
            counts: Default::default(),
            log: Mutex::new(None),
        });
        SharedQueue {
            map,
            map_len,
            kernel,
            len,
            kind,
            region,
        }
    }

    fn geometry(&self) -> QueueGeometry {
        QueueGeometry {
            num_slots: self.kernel.mask + 1,
            log2_slot_size: self.kernel.log2,
        }
    }

    /// The queue as the provider sees it, claiming `geometry` and `len` bytes.
    fn queue_claiming(&self, len: usize, geometry: QueueGeometry) -> Result<RxeQueue, QueueError> {
        match self.kind {
            // SAFETY: the buffer stays mapped until `self` is dropped, after every queue built
            // on it in these tests (refused claims are refused before any access); the test
            // plays the kernel through `KernelSide` only.
            Kind::Mapped => unsafe { RxeQueue::new(self.kernel.base, len, geometry) },
            Kind::Accessed => {
                let offset = self.kernel.base.as_ptr() as usize - self.map as usize;
                let queue = RxeQueue::accessed(self.region.clone(), offset, len, geometry);
                if let Ok(queue) = &queue {
                    assert!(!queue.is_mapped());
                }
                queue
            }
        }
    }

    fn try_queue(&self) -> Result<RxeQueue, QueueError> {
        self.queue_claiming(self.len, self.geometry())
    }

    fn queue(&self) -> RxeQueue {
        self.try_queue().unwrap()
    }

    /// Offset of slot `index` in the region.
    fn slot_offset(&self, index: u32) -> u64 {
        (self.kernel.slot(index) as usize - self.map as usize) as u64
    }

    /// Offset of the producer (128) or consumer (256) index word in the region.
    fn word_offset(&self, word: usize) -> u64 {
        (self.kernel.base.as_ptr() as usize + word - self.map as usize) as u64
    }
}

/// One access the provider made to a [`TestRegion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read { offset: u64, len: usize },
    Write { offset: u64, len: usize },
    Load { offset: u64 },
    Store { offset: u64, value: u32 },
}

/// How many accesses of each kind a [`TestRegion`] served.
#[derive(Default)]
struct Counts {
    reads: AtomicUsize,
    writes: AtomicUsize,
    loads: AtomicUsize,
    stores: AtomicUsize,
}

/// The provider's way to a [`SharedQueue`] that it does not map: bounds-checked copies and
/// atomic index accesses on the mapping, counted, and logged while logging is on.
struct TestRegion {
    base: NonNull<u8>,
    len: usize,
    counts: Counts,
    log: Mutex<Option<Vec<Access>>>,
}

// SAFETY: the region is only a pointer into a `SharedQueue` mapping that outlives every queue
// and thread using it in these tests; it is accessed with copies that follow the queue
// protocol and with atomics, like the kernel side.
unsafe impl Send for TestRegion {}
// SAFETY: as for Send; the counters and the log are thread-safe.
unsafe impl Sync for TestRegion {}

impl TestRegion {
    fn start_log(&self) {
        *self.log.lock().unwrap() = Some(Vec::new());
    }

    /// The accesses since the last `start_log` or `take_log`; logging stays on.
    fn take_log(&self) -> Vec<Access> {
        self.log
            .lock()
            .unwrap()
            .replace(Vec::new())
            .expect("logging was not started")
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

/// The kernel's view of a queue buffer.
#[derive(Clone, Copy)]
struct KernelSide {
    base: NonNull<u8>,
    mask: u32,
    log2: u32,
}

// SAFETY: the handle is only a pointer into a `SharedQueue` that outlives every thread using
// it (scoped threads); the indices are accessed atomically and slots according to the queue
// protocol, as the kernel does.
unsafe impl Send for KernelSide {}

impl KernelSide {
    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the header word lies in the mapping, is aligned, and both sides use atomics.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn producer(&self) -> &AtomicU32 {
        self.word(128)
    }

    fn consumer(&self) -> &AtomicU32 {
        self.word(256)
    }

    fn slot(&self, index: u32) -> *mut u8 {
        let offset = HEADER + (((index & self.mask) as usize) << self.log2);
        // SAFETY: a masked index names a slot inside the mapping.
        unsafe { self.base.as_ptr().add(offset) }
    }

    fn send_wqe(&self, index: u32) -> RxeSendWqe {
        // SAFETY: aligned slot inside the mapping, owned by the kernel side right now.
        unsafe { self.slot(index).cast::<RxeSendWqe>().read() }
    }

    fn recv_wqe(&self, index: u32) -> RxeRecvWqe {
        // SAFETY: as in `send_wqe`.
        unsafe { self.slot(index).cast::<RxeRecvWqe>().read() }
    }

    /// The SGE array (or inline bytes, as `len` bytes) after a WQE of `header` bytes.
    fn payload(&self, index: u32, header: usize, len: usize) -> Vec<u8> {
        assert!(header + len <= 1 << self.log2);
        // SAFETY: the range lies inside the slot (asserted).
        unsafe { std::slice::from_raw_parts(self.slot(index).add(header), len).to_vec() }
    }

    fn sges(&self, index: u32, header: usize, n: usize) -> Vec<RxeSge> {
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
    fn mark_kernel_owned(&self) {
        for i in 0..=self.mask {
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

    fn write_cqe(&self, index: u32, cqe: IbUverbsWc) {
        // SAFETY: aligned slot inside the mapping, owned by the kernel side (producer slot).
        unsafe { self.slot(index).cast::<IbUverbsWc>().write(cqe) }
    }
}

fn send_queue(shared: &SharedQueue, qp_type: QpType) -> SendQueue {
    let caps = SendQueueCaps {
        qp_type,
        max_sge: 4,
        max_inline: 256,
    };
    SendQueue::new(shared.queue(), caps).unwrap()
}

fn post(sq: &mut SendQueue, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
    // SAFETY: every inline SGE in these tests points into a live local buffer.
    unsafe { sq.post_send(wrs) }
}

fn sge_of(buf: &[u8], lkey: u32) -> Sge {
    Sge {
        addr: buf.as_ptr() as u64,
        length: buf.len() as u32,
        lkey,
    }
}

fn rxe_sges(sges: &[Sge]) -> Vec<RxeSge> {
    sges.iter()
        .map(|s| RxeSge {
            addr: Le64::new(s.addr),
            length: Le32::new(s.length),
            lkey: Le32::new(s.lkey),
        })
        .collect()
}

/// Checks the fields every send WQE shares.
fn check_common(wqe: &RxeSendWqe, wr: &SendWr<'_>, length: u32) {
    assert_eq!(wqe.wr.wr_id.get(), wr.wr_id);
    assert_eq!(wqe.wr.reserved.get(), 0);
    assert_eq!(wqe.wr.opcode.get(), wr.opcode as u32);
    assert_eq!(wqe.wr.send_flags.get(), wr.flags.bits());
    let imm = if wr.opcode.has_imm() { wr.imm_data } else { 0 };
    assert_eq!(u32::from_ne_bytes(wqe.wr.ex), imm);
    assert_eq!(wqe.state.get(), 0);
    assert_eq!(wqe.dma.length.get(), length);
    assert_eq!(wqe.dma.resid.get(), length);
    assert_eq!(wqe.dma.cur_sge.get(), 0);
    assert_eq!(wqe.dma.num_sge.get(), wr.sg_list.len() as u32);
    assert_eq!(wqe.dma.sge_offset.get(), 0);
    assert_eq!(wqe.dma.reserved.get(), 0);
}

/// Checks that the provider left the kernel-owned WQE fields alone: a mapped queue never
/// writes them, an accessed one writes its whole WQE at once with those fields zero (as
/// rdma-core's `ibv_wr_*` calls, which clear the WQE).
fn check_kernel_fields(wqe: &RxeSendWqe, kind: Kind) {
    let want = match kind {
        Kind::Mapped => KERNEL_OWNED,
        Kind::Accessed => 0,
    };
    for v in [
        wqe.status,
        wqe.mask,
        wqe.first_psn,
        wqe.last_psn,
        wqe.ack_length,
        wqe.ssn,
        wqe.has_rd_atomic,
    ] {
        assert_eq!(v.get(), want);
    }
}

fn rc_send_wqes_carry_every_field(kind: Kind) {
    let shared = SharedQueue::new(kind, 16, 9);
    let k = shared.kernel;
    k.mark_kernel_owned();
    let mut sq = send_queue(&shared, QpType::Rc);

    let a = [1u8; 100];
    let b = [2u8; 28];
    let c = [3u8; 4000];
    let inline_a: Vec<u8> = (0..200).map(|i| i as u8).collect();
    let inline_b = *b"tail of the inline payload";
    let atomic_buf = [0u8; 8];
    let sgl3 = [sge_of(&a, 11), sge_of(&b, 12), sge_of(&c, 13)];
    let inline_sgl = [sge_of(&inline_a, 0), sge_of(&[], 0), sge_of(&inline_b, 0)];
    let one = [sge_of(&c, 13)];
    let atomic_sgl = [sge_of(&atomic_buf, 14)];
    let signaled = SendFlags::SIGNALED;
    let wrs = [
        SendWr {
            wr_id: 100,
            opcode: WrOpcode::Send,
            flags: signaled | SendFlags::SOLICITED,
            sg_list: &sgl3,
            // Ignored without WITH_IMM.
            imm_data: 0xdead_beef,
            ..Default::default()
        },
        SendWr {
            wr_id: 101,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::empty(),
            sg_list: &one,
            imm_data: 0x1234_5678u32.to_be(),
            ..Default::default()
        },
        SendWr {
            wr_id: 102,
            opcode: WrOpcode::RdmaWrite,
            flags: signaled | SendFlags::INLINE,
            sg_list: &inline_sgl,
            remote_addr: 0x7f00_0000_1000,
            rkey: 0xabcd,
            ..Default::default()
        },
        SendWr {
            wr_id: 103,
            opcode: WrOpcode::RdmaWriteWithImm,
            flags: SendFlags::FENCE,
            sg_list: &sgl3[..2],
            imm_data: 7u32.to_be(),
            remote_addr: 0x10,
            rkey: 1,
            ..Default::default()
        },
        SendWr {
            wr_id: 104,
            opcode: WrOpcode::RdmaRead,
            flags: signaled | SendFlags::FENCE,
            sg_list: &one,
            remote_addr: 0xffff_ffff_0000,
            rkey: 0x8765_4321,
            ..Default::default()
        },
        SendWr {
            wr_id: 105,
            opcode: WrOpcode::AtomicCmpAndSwp,
            flags: signaled,
            sg_list: &atomic_sgl,
            remote_addr: 0x2000,
            rkey: 9,
            compare_add: 0x1111_2222_3333_4444,
            swap: 0x5555_6666_7777_8888,
            ..Default::default()
        },
        SendWr {
            wr_id: 106,
            opcode: WrOpcode::AtomicFetchAndAdd,
            flags: signaled,
            sg_list: &atomic_sgl,
            remote_addr: 0x2008,
            rkey: 9,
            compare_add: 5,
            ..Default::default()
        },
        SendWr {
            wr_id: 107,
            opcode: WrOpcode::Send,
            flags: signaled,
            sg_list: &[],
            ..Default::default()
        },
    ];
    post(&mut sq, &wrs).unwrap();
    assert_eq!(k.producer().load(Ordering::Acquire), wrs.len() as u32);

    for (i, wr) in wrs.iter().enumerate() {
        let wqe = k.send_wqe(i as u32);
        check_kernel_fields(&wqe, kind);
        let length: u32 = wr.sg_list.iter().map(|s| s.length).sum();
        check_common(&wqe, wr, length);
        let union = wqe.wr.wr.bytes;
        match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm => {
                assert_eq!(union, [0; 120]);
                assert_eq!(wqe.iova.get(), 0);
            }
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                let rdma = wqe.wr.wr.rdma();
                assert_eq!(
                    (rdma.remote_addr.get(), rdma.rkey.get(), rdma.reserved.get()),
                    (wr.remote_addr, wr.rkey, 0)
                );
                assert_eq!(union[16..], [0; 104]);
                assert_eq!(wqe.iova.get(), wr.remote_addr);
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let atomic = wqe.wr.wr.atomic();
                assert_eq!(atomic.remote_addr.get(), wr.remote_addr);
                assert_eq!(atomic.compare_add.get(), wr.compare_add);
                assert_eq!(atomic.swap.get(), wr.swap);
                assert_eq!((atomic.rkey.get(), atomic.reserved.get()), (wr.rkey, 0));
                assert_eq!(union[32..], [0; 88]);
                assert_eq!(wqe.iova.get(), wr.remote_addr);
            }
        }
        if wr.flags.contains(SendFlags::INLINE) {
            let mut want = inline_a.clone();
            want.extend_from_slice(&inline_b);
            assert_eq!(k.payload(i as u32, 208, want.len()), want);
        } else {
            assert_eq!(
                k.sges(i as u32, 208, wr.sg_list.len()),
                rxe_sges(wr.sg_list)
            );
        }
    }
    assert_eq!(k.send_wqe(1).wr.ex, [0x12, 0x34, 0x56, 0x78]);
}

fn ud_sends_name_the_ah_or_carry_the_av(kind: Kind) {
    let shared = SharedQueue::new(kind, 8, 9);
    let k = shared.kernel;
    let mut sq = send_queue(&shared, QpType::Ud);
    let mut av = RxeAv::new_zeroed();
    av.as_mut_bytes()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8 + 1);
    let new_kernel_ah = RxeAddressHandle { ah_num: 7, av };
    let old_kernel_ah = RxeAddressHandle { ah_num: 0, av };
    let buf = [0u8; 64];
    let sgl = [sge_of(&buf, 3)];
    fn wr<'a>(
        wr_id: u64,
        ah: &'a RxeAddressHandle,
        opcode: WrOpcode,
        sgl: &'a [Sge],
    ) -> SendWr<'a> {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::SIGNALED,
            sg_list: sgl,
            imm_data: 0x0102_0304,
            ud: Some(UdDest {
                ah,
                remote_qpn: 0x11,
                remote_qkey: 0x1111_0000,
            }),
            ..Default::default()
        }
    }
    post(
        &mut sq,
        &[
            wr(1, &new_kernel_ah, WrOpcode::Send, &sgl),
            wr(2, &old_kernel_ah, WrOpcode::SendWithImm, &sgl),
        ],
    )
    .unwrap();
    for (index, want_ah_num, want_av) in [(0, 7, RxeAv::new_zeroed()), (1, 0, av)] {
        let wqe = k.send_wqe(index);
        let ud = wqe.wr.wr.ud();
        assert_eq!(
            (ud.remote_qpn.get(), ud.remote_qkey.get()),
            (0x11, 0x1111_0000)
        );
        assert_eq!(
            (ud.pkey_index, ud.reserved, ud.pad),
            (Le16::ZERO, Le16::ZERO, [0; 16])
        );
        assert_eq!(ud.ah_num.get(), want_ah_num);
        assert_eq!(ud.av, want_av);
        assert_eq!(wqe.iova.get(), 0);
        assert_eq!(k.sges(index, 208, 1), rxe_sges(&sgl));
    }
    assert_eq!(u32::from_ne_bytes(k.send_wqe(1).wr.ex), 0x0102_0304);

    let mut write = wr(3, &new_kernel_ah, WrOpcode::RdmaWrite, &sgl);
    assert_eq!(
        post(&mut sq, &[write]),
        Err((
            0,
            PostError::OpcodeNotSupported {
                opcode: WrOpcode::RdmaWrite,
                qp_type: QpType::Ud
            }
        ))
    );
    write.opcode = WrOpcode::Send;
    write.ud = None;
    assert_eq!(post(&mut sq, &[write]), Err((0, PostError::MissingUdDest)));
    assert_eq!(k.producer().load(Ordering::Acquire), 2);
}

fn refusals_say_how_many_were_posted(kind: Kind) {
    let shared = SharedQueue::new(kind, 16, 9);
    let k = shared.kernel;
    let mut sq = send_queue(&shared, QpType::Rc);
    let big = vec![0u8; 300];
    let small = [0u8; 4];
    let ok = SendWr {
        wr_id: 1,
        ..Default::default()
    };
    let sge = sge_of(&small, 1);
    let five = [sge; 5];
    let huge = [Sge {
        addr: 0x1000,
        length: u32::MAX,
        lkey: 1,
    }; 2];
    let big_sgl = [sge_of(&big, 0)];
    let small_sgl = [sge];
    let ah = RxeAddressHandle {
        ah_num: 1,
        av: RxeAv::new_zeroed(),
    };
    let cases: [(SendWr<'_>, PostError); 7] = [
        (
            SendWr {
                sg_list: &five,
                ..ok
            },
            PostError::TooManySges { num: 5, max: 4 },
        ),
        (
            SendWr {
                sg_list: &huge,
                ..ok
            },
            PostError::MessageTooLong(2 * u64::from(u32::MAX)),
        ),
        (
            SendWr {
                flags: SendFlags::INLINE,
                sg_list: &big_sgl,
                ..ok
            },
            PostError::InlineTooLong { len: 300, max: 256 },
        ),
        (
            SendWr {
                opcode: WrOpcode::RdmaRead,
                flags: SendFlags::INLINE,
                sg_list: &small_sgl,
                ..ok
            },
            PostError::InlineNotAllowed(WrOpcode::RdmaRead),
        ),
        (
            SendWr {
                opcode: WrOpcode::AtomicFetchAndAdd,
                sg_list: &small_sgl,
                ..ok
            },
            PostError::InvalidAtomic,
        ),
        (
            SendWr {
                opcode: WrOpcode::AtomicCmpAndSwp,
                sg_list: &[Sge { length: 8, ..sge }],
                remote_addr: 0x1004,
                ..ok
            },
            PostError::InvalidAtomic,
        ),
        (
            SendWr {
                ud: Some(UdDest {
                    ah: &ah,
                    remote_qpn: 1,
                    remote_qkey: 1,
                }),
                ..ok
            },
            PostError::UnexpectedUdDest,
        ),
    ];
    let mut posted = 0;
    for (bad, want) in cases {
        let wrs = [ok, ok, bad, ok];
        assert_eq!(post(&mut sq, &wrs), Err((2, want)));
        posted += 2;
        assert_eq!(k.producer().load(Ordering::Acquire), posted);
        // Keep the queue from filling up: the "kernel" consumes everything.
        k.consumer().store(posted & 15, Ordering::Release);
    }
}

fn full_queue_refuses_without_overwriting(kind: Kind) {
    let shared = SharedQueue::new(kind, 4, 9);
    let k = shared.kernel;
    let mut sq = send_queue(&shared, QpType::Rc);
    let wrs: Vec<SendWr<'_>> = (0..5)
        .map(|wr_id| SendWr {
            wr_id,
            ..Default::default()
        })
        .collect();
    assert_eq!(post(&mut sq, &wrs), Err((3, PostError::QueueFull)));
    assert_eq!(k.producer().load(Ordering::Acquire), 3);
    assert_eq!(
        k.send_wqe(3).wr.wr_id.get(),
        0,
        "the free slot must not be written"
    );
    for i in 0..3 {
        assert_eq!(k.send_wqe(i).wr.wr_id.get(), u64::from(i));
    }
    assert_eq!(post(&mut sq, &wrs[3..4]), Err((0, PostError::QueueFull)));

    // The kernel consumes two; two more fit, wrapping around.
    k.consumer().store(2, Ordering::Release);
    assert_eq!(post(&mut sq, &wrs[3..]), Ok(()));
    assert_eq!(k.producer().load(Ordering::Acquire), 1);
    assert_eq!(k.send_wqe(3).wr.wr_id.get(), 3);
    assert_eq!(k.send_wqe(0).wr.wr_id.get(), 4);
    assert_eq!(
        k.send_wqe(1).wr.wr_id.get(),
        1,
        "an unconsumed slot must not be overwritten"
    );
}

/// Whether the threaded test's request number `i` asks for a completion.
fn is_signaled(i: u64) -> bool {
    !i.is_multiple_of(3)
}

/// The request the threaded test posts as number `i`, with its inline payload in `inline`.
fn nth_wr<'a>(i: u64, sgl: &'a mut [Sge; 3], inline: &mut [u8; 48]) -> SendWr<'a> {
    let opcode = match i % 5 {
        0 => WrOpcode::Send,
        1 => WrOpcode::SendWithImm,
        2 => WrOpcode::RdmaWrite,
        3 => WrOpcode::RdmaWriteWithImm,
        _ => WrOpcode::RdmaRead,
    };
    let mut flags = SendFlags::empty();
    if is_signaled(i) {
        flags |= SendFlags::SIGNALED;
    }
    if i.is_multiple_of(7) {
        flags |= SendFlags::FENCE;
    }
    let num_sge = (i % 3) as usize + 1;
    let is_inline = opcode.allows_inline() && i.is_multiple_of(4);
    if is_inline {
        flags |= SendFlags::INLINE;
        inline
            .iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (i as u8) ^ (j as u8));
        for (k, sge) in sgl.iter_mut().enumerate() {
            *sge = Sge {
                addr: inline[k * 16..].as_ptr() as u64,
                length: 16,
                lkey: 0,
            };
        }
    } else {
        for (k, sge) in sgl.iter_mut().enumerate() {
            *sge = Sge {
                addr: 0x1000_0000 + i * 0x100 + k as u64 * 0x10,
                length: (i % 1000) as u32 + k as u32,
                lkey: i as u32 ^ 0x5a,
            };
        }
    }
    SendWr {
        wr_id: i,
        opcode,
        flags,
        sg_list: &sgl[..num_sge],
        imm_data: (i as u32).to_be(),
        remote_addr: 0x7000_0000_0000 + i * 8,
        rkey: i as u32 ^ 0x55,
        ..Default::default()
    }
}

/// Plays the kernel for `total` send WQEs: checks each one, completes the signaled ones in
/// the CQ and hands the slot back.
fn simulated_kernel(sq: KernelSide, cq: KernelSide, total: u64) {
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
        let mut sgl = [Sge::default(); 3];
        let mut inline = [0u8; 48];
        let want = nth_wr(i, &mut sgl, &mut inline);
        let wqe = sq.send_wqe(sq_cons);
        let length: u32 = want.sg_list.iter().map(|s| s.length).sum();
        check_common(&wqe, &want, length);
        if want.opcode.is_rdma() {
            let rdma = wqe.wr.wr.rdma();
            assert_eq!(
                (rdma.remote_addr.get(), rdma.rkey.get()),
                (want.remote_addr, want.rkey)
            );
            assert_eq!(wqe.iova.get(), want.remote_addr);
        } else {
            assert_eq!(wqe.wr.wr.bytes, [0; 120]);
        }
        if want.flags.contains(SendFlags::INLINE) {
            let n = length as usize;
            assert_eq!(sq.payload(sq_cons, 208, n), inline[..n]);
        } else {
            assert_eq!(
                sq.sges(sq_cons, 208, want.sg_list.len()),
                rxe_sges(want.sg_list)
            );
        }

        if want.flags.contains(SendFlags::SIGNALED) {
            // Wait for room: one CQ slot always stays empty.
            while (cq_prod + 1) & cq.mask == cq.consumer().load(Ordering::Acquire) {
                assert!(Instant::now() < deadline, "kernel: CQ never drained");
                thread::yield_now();
            }
            let opcode = match want.opcode {
                WrOpcode::RdmaRead => WcOpcode::RdmaRead,
                WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
                _ => WcOpcode::Send,
            };
            cq.write_cqe(
                cq_prod,
                IbUverbsWc {
                    wr_id: wqe.wr.wr_id,
                    opcode: Le32::new(opcode.raw()),
                    byte_len: wqe.dma.length,
                    qp_num: Le32::new(17),
                    ..IbUverbsWc::new_zeroed()
                },
            );
            cq_prod = (cq_prod + 1) & cq.mask;
            cq.producer().store(cq_prod, Ordering::Release);
        }
        sq_cons = (sq_cons + 1) & sq.mask;
        sq.consumer().store(sq_cons, Ordering::Release);
        i += 1;
    }
}

fn threaded_kernel_sees_every_request_across_many_wraps(kind: Kind) {
    const TOTAL: u64 = 20_000;
    let sq_shared = SharedQueue::new(kind, 8, 9);
    let cq_shared = SharedQueue::new(kind, 8, 6);
    let mut sq = send_queue(&sq_shared, QpType::Rc);
    let mut cq = CompletionQueue::new(cq_shared.queue()).unwrap();
    let (sq_kernel, cq_kernel) = (sq_shared.kernel, cq_shared.kernel);

    thread::scope(|s| {
        let kernel = s.spawn(move || simulated_kernel(sq_kernel, cq_kernel, TOTAL));
        let deadline = Instant::now() + DEADLINE;
        let mut next = 0u64;
        let mut expected = (0..TOTAL).filter(|&i| is_signaled(i));
        let mut completed = 0u64;
        let mut full_seen = 0u64;
        let total_signaled = (0..TOTAL).filter(|&i| is_signaled(i)).count() as u64;
        let mut wcs = [WorkCompletion::default(); 5];
        while completed < total_signaled {
            assert!(
                !kernel.is_finished() || next == TOTAL,
                "kernel thread ended early"
            );
            assert!(Instant::now() < deadline, "stuck at request {next}");
            if next < TOTAL {
                let batch = (TOTAL - next).min(next % 4 + 1);
                let mut sgls = [[Sge::default(); 3]; 4];
                let mut inlines = [[0u8; 48]; 4];
                let mut wrs = [SendWr::default(); 4];
                for ((wr, (sgl, inline)), i) in wrs
                    .iter_mut()
                    .zip(sgls.iter_mut().zip(inlines.iter_mut()))
                    .zip(next..next + batch)
                {
                    *wr = nth_wr(i, sgl, inline);
                }
                match post(&mut sq, &wrs[..batch as usize]) {
                    Ok(()) => next += batch,
                    Err((n, PostError::QueueFull)) => {
                        next += n as u64;
                        full_seen += 1;
                    }
                    Err(e) => panic!("post_send refused request {next}: {e:?}"),
                }
            }
            let n = cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                let want = expected.next().unwrap();
                assert_eq!(wc.wr_id, want);
                assert_eq!(wc.status, WcStatus::Success);
                assert_eq!(wc.qp_num, 17);
                let mut sgl = [Sge::default(); 3];
                let mut inline = [0u8; 48];
                let wr = nth_wr(want, &mut sgl, &mut inline);
                let length: u32 = wr.sg_list.iter().map(|s| s.length).sum();
                assert_eq!(wc.byte_len, length);
                completed += 1;
            }
        }
        kernel.join().expect("simulated kernel failed");
        assert!(full_seen > 0, "the test never filled the 7-slot queue");
    });
    assert_eq!(cq.poll(&mut [WorkCompletion::default(); 2]), 0);
    if kind == Kind::Accessed {
        // One write per WQE, one read per CQE, nothing else but index accesses.
        let (sq_counts, cq_counts) = (&sq_shared.region.counts, &cq_shared.region.counts);
        let total_signaled = (0..TOTAL).filter(|&i| is_signaled(i)).count();
        assert_eq!(sq_counts.writes.load(Ordering::Relaxed), TOTAL as usize);
        assert_eq!(sq_counts.reads.load(Ordering::Relaxed), 0);
        assert_eq!(cq_counts.reads.load(Ordering::Relaxed), total_signaled);
        assert_eq!(cq_counts.writes.load(Ordering::Relaxed), 0);
    }
}

fn receive_wqes_carry_every_field_and_wrap(kind: Kind) {
    let shared = SharedQueue::new(kind, 8, 7);
    let k = shared.kernel;
    let mut rq = RecvQueue::new(shared.queue(), 4).unwrap();
    assert_eq!(rq.capacity(), 7);
    let sgl: Vec<Sge> = (0..4)
        .map(|j| Sge {
            addr: 0x4000 + j * 0x1000,
            length: 0x1000 - j as u32,
            lkey: 40 + j as u32,
        })
        .collect();
    let wrs = [
        RecvWr {
            wr_id: 10,
            sg_list: &sgl,
        },
        RecvWr {
            wr_id: 11,
            sg_list: &sgl[..1],
        },
        RecvWr {
            wr_id: 12,
            sg_list: &[],
        },
    ];
    rq.post_recv(&wrs).unwrap();
    assert_eq!(k.producer().load(Ordering::Acquire), 3);
    for (i, wr) in wrs.iter().enumerate() {
        let wqe = k.recv_wqe(i as u32);
        let length: u32 = wr.sg_list.iter().map(|s| s.length).sum();
        assert_eq!(
            (wqe.wr_id.get(), wqe.reserved.get(), wqe.padding.get()),
            (wr.wr_id, 0, 0)
        );
        assert_eq!(
            (
                wqe.dma.length.get(),
                wqe.dma.resid.get(),
                wqe.dma.cur_sge.get(),
                wqe.dma.num_sge.get()
            ),
            (length, length, 0, wr.sg_list.len() as u32)
        );
        assert_eq!((wqe.dma.sge_offset.get(), wqe.dma.reserved.get()), (0, 0));
        assert_eq!(k.sges(i as u32, 40, wr.sg_list.len()), rxe_sges(wr.sg_list));
    }

    let five = [sgl[0]; 5];
    let too_many = [
        wrs[1],
        RecvWr {
            wr_id: 13,
            sg_list: &five,
        },
    ];
    assert_eq!(
        rq.post_recv(&too_many),
        Err((1, PostError::TooManySges { num: 5, max: 4 }))
    );
    let fill = [wrs[2]; 4];
    assert_eq!(rq.post_recv(&fill), Err((3, PostError::QueueFull)));
    assert_eq!(k.producer().load(Ordering::Acquire), 7);

    // Many wraps on a full queue: each time the kernel consumes one, exactly one more fits.
    let mut cons = 0u32;
    for round in 0..5000u64 {
        cons = (cons + 1) & 7;
        k.consumer().store(cons, Ordering::Release);
        let wr = RecvWr {
            wr_id: round,
            sg_list: &sgl[..(round % 5) as usize],
        };
        assert_eq!(rq.post_recv(&[wr, wr]), Err((1, PostError::QueueFull)));
        let prod = k.producer().load(Ordering::Acquire);
        assert_eq!(prod, cons.wrapping_sub(1) & 7);
        let wqe = k.recv_wqe(prod.wrapping_sub(1));
        assert_eq!(
            (wqe.wr_id.get(), wqe.dma.num_sge.get()),
            (round, (round % 5) as u32)
        );
        assert_eq!(
            k.sges(prod.wrapping_sub(1), 40, (round % 5) as usize),
            rxe_sges(wr.sg_list)
        );
    }
}

fn poll_converts_native_completions(kind: Kind) {
    let shared = SharedQueue::new(kind, 4, 7);
    let k = shared.kernel;
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    let mut wcs = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wcs), 0);

    let recv = IbUverbsWc {
        wr_id: Le64::new(0xfeed),
        status: Le32::new(0),
        opcode: Le32::new(128),
        vendor_err: Le32::new(0),
        byte_len: Le32::new(4096),
        ex: [0xde, 0xad, 0xbe, 0xef],
        qp_num: Le32::new(0x11),
        src_qp: Le32::new(0x22),
        wc_flags: Le32::new(0x3),
        pkey_index: Le16::new(5),
        slid: Le16::new(6),
        sl: 7,
        dlid_path_bits: 8,
        port_num: 1,
        reserved: 0xff,
    };
    let flushed = IbUverbsWc {
        wr_id: Le64::new(2),
        status: Le32::new(5),
        vendor_err: Le32::new(0x99),
        qp_num: Le32::new(0x11),
        ..IbUverbsWc::new_zeroed()
    };
    let strange = IbUverbsWc {
        wr_id: Le64::new(3),
        status: Le32::new(77),
        opcode: Le32::new(55),
        ..IbUverbsWc::new_zeroed()
    };
    for (i, cqe) in [recv, flushed, strange].into_iter().enumerate() {
        k.write_cqe(i as u32, cqe);
    }
    k.producer().store(3, Ordering::Release);

    assert_eq!(cq.poll(&mut wcs), 2);
    assert_eq!(k.consumer().load(Ordering::Acquire), 2);
    assert_eq!(
        wcs[0],
        WorkCompletion {
            wr_id: 0xfeed,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 4096,
            imm_data: u32::from_ne_bytes([0xde, 0xad, 0xbe, 0xef]),
            qp_num: 0x11,
            src_qp: 0x22,
            wc_flags: WcFlags::from_bits_retain(0x3),
            pkey_index: 5,
            slid: 6,
            sl: 7,
            dlid_path_bits: 8,
            port_num: 1,
            vendor_err: 0,
        }
    );
    assert_eq!(u32::from_be(wcs[0].imm_data), 0xdead_beef);
    assert!(wcs[0].wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status, wcs[1].vendor_err),
        (2, WcStatus::WrFlushErr, 0x99)
    );

    assert_eq!(cq.poll(&mut wcs), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (3, WcStatus::Other(77), WcOpcode::Other(55))
    );
    assert_eq!(cq.poll(&mut wcs), 0);
    assert_eq!(cq.poll(&mut []), 0);
    assert_eq!(k.consumer().load(Ordering::Acquire), 3);
}

fn corrupted_headers_are_refused(kind: Kind) {
    let good = SharedQueue::new(kind, 8, 7);
    assert!(good.try_queue().is_ok());
    let wrong_size = SharedQueue::with_header(kind, 8, 7, 8, 7);
    assert_eq!(
        wrong_size.try_queue().unwrap_err(),
        QueueError::HeaderMismatch { log2: 8, mask: 7 }
    );
    let wrong_mask = SharedQueue::with_header(kind, 8, 7, 7, 0xffff);
    assert_eq!(
        wrong_mask.try_queue().unwrap_err(),
        QueueError::HeaderMismatch {
            log2: 7,
            mask: 0xffff
        }
    );
    let wild_index = SharedQueue::new(kind, 8, 7);
    wild_index
        .kernel
        .consumer()
        .store(0x8000_0001, Ordering::Relaxed);
    assert_eq!(
        wild_index.try_queue().unwrap_err(),
        QueueError::IndexOutOfRange {
            which: "consumer",
            value: 0x8000_0001
        }
    );
    // The device claims more than is mapped.
    let short = good.queue_claiming(
        good.len,
        QueueGeometry {
            num_slots: 16,
            log2_slot_size: 7,
        },
    );
    assert_eq!(
        short.unwrap_err(),
        QueueError::TooSmall {
            need: 384 + 16 * 128,
            mapped: good.len
        }
    );
    // Slots too small for what the queue is created for.
    let caps = SendQueueCaps {
        qp_type: QpType::Rc,
        max_sge: 4,
        max_inline: 256,
    };
    assert_eq!(
        SendQueue::new(good.queue(), caps).unwrap_err(),
        QueueError::SlotTooSmall {
            need: 208 + 256,
            slot: 128
        }
    );
    assert_eq!(
        RecvQueue::new(good.queue(), 6).unwrap_err(),
        QueueError::SlotTooSmall {
            need: 40 + 6 * 16,
            slot: 128
        }
    );
}

fn corrupted_indices_stay_inside_the_buffer(kind: Kind) {
    // A 4-slot CQ of 64-byte slots ends exactly at the guard page: reading one byte past its
    // last slot would crash the test.
    let shared = SharedQueue::new(kind, 4, 6);
    let k = shared.kernel;
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    for i in 0..4 {
        k.write_cqe(
            i,
            IbUverbsWc {
                wr_id: Le64::new(u64::from(i)),
                ..IbUverbsWc::new_zeroed()
            },
        );
    }
    let mut wcs = [WorkCompletion::default(); 16];
    let mut seen = 0u32;
    for wild in [0xffff_ffff, 0x1234_5677, 0x8000_0002, 0xffff_fffc] {
        k.producer().store(wild, Ordering::Release);
        let n = cq.poll(&mut wcs);
        assert!(n <= 3, "at most capacity entries, got {n}");
        for wc in &wcs[..n] {
            assert_eq!(wc.wr_id, u64::from(seen & 3));
            seen += 1;
        }
        assert_eq!(k.consumer().load(Ordering::Acquire), wild & 3);
    }
    assert!(seen > 0);

    // A wild SQ consumer index cannot make the provider write outside the queue either.
    let sq_shared = SharedQueue::new(kind, 2, 9);
    let sk = sq_shared.kernel;
    let caps = SendQueueCaps {
        qp_type: QpType::Rc,
        max_sge: 1,
        max_inline: 256,
    };
    let mut sq = SendQueue::new(sq_shared.queue(), caps).unwrap();
    let payload = [7u8; 256];
    let sgl = [sge_of(&payload, 0)];
    let wr = SendWr {
        flags: SendFlags::INLINE,
        sg_list: &sgl,
        ..Default::default()
    };
    for wild in [0xffff_ffffu32, 0xffff_fffe, 0x7fff_ffff] {
        sk.consumer().store(wild, Ordering::Release);
        let _ = post(&mut sq, &[wr]);
        assert!(sk.producer().load(Ordering::Acquire) <= 1);
    }
    assert_eq!(sk.payload(1, 208, 256), payload);
}

/// Posts a batch on an accessed queue and checks the access log: per request one Acquire load
/// of the consumer index and one write of the whole WQE into its slot; after all of them, one
/// Release store of the producer index. A provider that published the index before the WQE
/// bytes (or wrote a WQE in pieces) fails here.
#[test]
fn accessed_send_queue_writes_each_wqe_once_before_publishing() {
    let shared = SharedQueue::new(Kind::Accessed, 8, 9);
    let mut sq = send_queue(&shared, QpType::Rc);
    let region = &shared.region;
    let inline = [9u8; 40];
    let buf = [0u8; 16];
    let inline_sgl = [sge_of(&inline[..30], 0), sge_of(&inline[30..], 0)];
    let sgl = [sge_of(&buf, 1), sge_of(&buf, 2), sge_of(&buf, 3)];
    let wrs = [
        SendWr {
            wr_id: 1,
            flags: SendFlags::INLINE,
            sg_list: &inline_sgl,
            ..Default::default()
        },
        SendWr {
            wr_id: 2,
            sg_list: &sgl,
            ..Default::default()
        },
        SendWr {
            wr_id: 3,
            ..Default::default()
        },
    ];
    let consumer = Access::Load {
        offset: shared.word_offset(256),
    };
    let wqe = |index: u32, len: usize| Access::Write {
        offset: shared.slot_offset(index),
        len: 208 + len,
    };
    let published = |value: u32| Access::Store {
        offset: shared.word_offset(128),
        value,
    };

    region.start_log();
    post(&mut sq, &wrs).unwrap();
    assert_eq!(
        region.take_log(),
        [
            consumer,
            wqe(0, 40),
            consumer,
            wqe(1, 3 * 16),
            consumer,
            wqe(2, 0),
            published(3)
        ]
    );
    assert_eq!(shared.kernel.send_wqe(0).wr.wr_id.get(), 1);
    assert_eq!(shared.kernel.payload(0, 208, 40), inline);

    // A refusal after one request: that one is written, then published, nothing else.
    let bad = SendWr {
        sg_list: &[sgl[0]; 5],
        ..wrs[2]
    };
    post(&mut sq, &[wrs[2], bad, wrs[2]]).unwrap_err();
    assert_eq!(region.take_log(), [consumer, wqe(3, 0), published(4)]);
    // A refusal of the first request publishes nothing.
    post(&mut sq, &[bad]).unwrap_err();
    assert_eq!(region.take_log(), []);
    // A full queue: no write into the free slot, no store.
    assert_eq!(post(&mut sq, &[wrs[2]; 4]), Err((3, PostError::QueueFull)));
    let log = region.take_log();
    assert_eq!(log[..4], [consumer, wqe(4, 0), consumer, wqe(5, 0)]);
    assert_eq!(log[4..], [consumer, wqe(6, 0), consumer, published(7)]);
}

/// The same for receive WQEs (the SRQ path is the same queue type).
#[test]
fn accessed_receive_queue_writes_each_wqe_once_before_publishing() {
    let shared = SharedQueue::new(Kind::Accessed, 4, 7);
    let mut rq = RecvQueue::new(shared.queue(), 4).unwrap();
    let region = &shared.region;
    let sgl = [Sge {
        addr: 0x1000,
        length: 64,
        lkey: 5,
    }; 4];
    region.start_log();
    let wrs = [
        RecvWr {
            wr_id: 1,
            sg_list: &sgl,
        },
        RecvWr {
            wr_id: 2,
            sg_list: &sgl[..1],
        },
    ];
    rq.post_recv(&wrs).unwrap();
    let consumer = Access::Load {
        offset: shared.word_offset(256),
    };
    let wqe = |index: u32, sges: usize| Access::Write {
        offset: shared.slot_offset(index),
        len: 40 + 16 * sges,
    };
    assert_eq!(
        region.take_log(),
        [
            consumer,
            wqe(0, 4),
            consumer,
            wqe(1, 1),
            Access::Store {
                offset: shared.word_offset(128),
                value: 2
            }
        ]
    );
    assert_eq!(shared.kernel.recv_wqe(1).wr_id.get(), 2);
}

/// Polling an accessed CQ: one Acquire load of the producer index before any CQE is read, one
/// read per CQE, and the consumer index stored (Release) only after the last read.
#[test]
fn accessed_completion_queue_reads_before_handing_slots_back() {
    let shared = SharedQueue::new(Kind::Accessed, 8, 6);
    let mut cq = CompletionQueue::new(shared.queue()).unwrap();
    let k = shared.kernel;
    for i in 0..3 {
        k.write_cqe(
            i,
            IbUverbsWc {
                wr_id: Le64::new(10 + u64::from(i)),
                ..IbUverbsWc::new_zeroed()
            },
        );
    }
    k.producer().store(3, Ordering::Release);
    let region = &shared.region;
    region.start_log();
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(cq.poll(&mut wcs), 3);
    assert_eq!(
        wcs[..3].iter().map(|wc| wc.wr_id).collect::<Vec<_>>(),
        [10, 11, 12]
    );
    let cqe = |index: u32| Access::Read {
        offset: shared.slot_offset(index),
        len: size_of::<IbUverbsWc>(),
    };
    let producer = Access::Load {
        offset: shared.word_offset(128),
    };
    assert_eq!(
        region.take_log(),
        [
            producer,
            cqe(0),
            cqe(1),
            cqe(2),
            Access::Store {
                offset: shared.word_offset(256),
                value: 3
            }
        ]
    );
    // Nothing new: one load, nothing else.
    assert_eq!(cq.poll(&mut wcs), 0);
    assert_eq!(region.take_log(), [producer]);
}

/// Runs each test above for both ways of reaching the queue.
macro_rules! for_both_kinds {
    ($($test:ident),+ $(,)?) => {
        mod mapped {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Kind::Mapped);
                }
            )+
        }

        mod accessed {
            $(
                #[test]
                fn $test() {
                    super::$test(super::Kind::Accessed);
                }
            )+
        }
    };
}

for_both_kinds!(
    rc_send_wqes_carry_every_field,
    ud_sends_name_the_ah_or_carry_the_av,
    refusals_say_how_many_were_posted,
    full_queue_refuses_without_overwriting,
    threaded_kernel_sees_every_request_across_many_wraps,
    receive_wqes_carry_every_field_and_wrap,
    poll_converts_native_completions,
    corrupted_headers_are_refused,
    corrupted_indices_stay_inside_the_buffer,
);

//! Memory windows on a real rdma_rxe device (run inside the test VM, as `device_rxe`):
//!
//! `target/debug/vrdma-vm run -- target/debug/deps/device_rxe_windows-HASH --ignored
//! --nocapture --test-threads=1`
//!
//! ALLOC_MW/DEALLOC_MW of both types through the uverbs write ABI, and one isolation property
//! spec §12 asks about: a window of one uverbs context (one guest) cannot be bound to an MR of
//! another context named by its lkey. Run on Linux 6.12: a bind of the attacker's
//! type-2 window to its own MW_BIND MR succeeds on the same QP, the bind to the other
//! context's MR is refused (the QP goes to error, the bind completes flushed) — although a
//! reading of rxe_mw.c had suggested otherwise. Part of the `backend-device` suite.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use vrdma::provider::rxe_v1::{CompletionQueue, RxeQueue, SendQueue, SendQueueCaps};
use vrdma::provider::{inc_rkey, MwBind, SendFlags, SendWr, WorkCompletion};
use vrdma_backend::control::rings::slot_geometry;
use vrdma_backend::host::*;
use vrdma_spec::attr::qp::{GlobalRoute, QpCaps};
use vrdma_spec::rxe_v1::{self, send_wqe_size};
use vrdma_spec::verbs::{
    AccessFlags, Gid, Mtu, MwType, QpAttrMask, QpState, QpType, WcOpcode, WcStatus,
};
use vrdma_spec::wire::{AhAttr, QpAttr};

const PAGE: usize = 4096;
const IOVA: u64 = 0x7b00_0000_0000;
const POLL_LIMIT: Duration = Duration::from_secs(20);

/// A shared mapping of an rxe queue buffer, or anonymous memory.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize, flags: libc::c_int, fd: libc::c_int, offset: u64) -> Mapping {
        let offset = libc::off_t::try_from(offset).expect("mmap offset fits off_t");
        // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned NULL"),
            len,
        }
    }

    fn queue(fd: BorrowedFd<'_>, buffer: QueueBuffer) -> Mapping {
        Mapping::new(buffer.len, libc::MAP_SHARED, fd.as_raw_fd(), buffer.offset)
    }

    fn anonymous(len: usize) -> Mapping {
        Mapping::new(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn fill(&self, seed: u8) {
        // SAFETY: writable for `len` bytes; no work request uses the page yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A queue mapped once from the cmd fd and wrapped by the guest library's provider.
struct Ring<Q> {
    /// Declared first: dropped before the mapping it points into.
    queue: Q,
    _map: Mapping,
}

fn ring<Q>(
    ctx: &dyn HostContext,
    buffer: QueueBuffer,
    depth: u32,
    entry_bytes: usize,
    wrap: impl FnOnce(RxeQueue) -> Q,
) -> Ring<Q> {
    let map = Mapping::queue(ctx.queue_fd(), buffer);
    let num_slots = depth + 1;
    let geometry = slot_geometry(buffer.len as u64, num_slots, entry_bytes).unwrap();
    // SAFETY: the mapping is readable and writable and outlives the queue (field order); only
    // the kernel and this queue access it.
    let queue = unsafe { RxeQueue::new(map.ptr, map.len, geometry) }.unwrap();
    Ring {
        queue: wrap(queue),
        _map: map,
    }
}

fn poll_one(cq: &mut Ring<CompletionQueue>) -> WorkCompletion {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default()];
    while cq.queue.poll(&mut wc) == 0 {
        assert!(start.elapsed() < POLL_LIMIT, "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
    wc[0]
}

fn post(ctx: &dyn HostContext, qp: QpHandle, sq: &mut Ring<SendQueue>, wr: SendWr<'_>) {
    assert!(!wr.flags.contains(SendFlags::INLINE));
    // SAFETY: not an inline request: the provider dereferences none of its SGEs.
    unsafe { sq.queue.post_send(&[wr]) }.unwrap_or_else(|(_, e)| panic!("post {wr:?}: {e}"));
    ctx.kick_send(qp).unwrap();
}

fn modify(ctx: &dyn HostContext, qp: QpHandle, attr: QpAttr, mask: QpAttrMask) {
    ctx.modify_qp(qp, &attr, mask)
        .unwrap_or_else(|e| panic!("modify_qp to {:?}: {e}", attr.qp_state()));
}

/// INIT, RTR and RTS towards `remote_qpn` over rxe0 loopback from GID 0.
fn connect_rc(ctx: &dyn HostContext, qp: QpHandle, remote_qpn: u32, gid: [u8; 16], mtu: Mtu) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let init = QpAttr::default()
        .with_qp_state(QpState::Init)
        .with_pkey_index(0)
        .with_port_num(1)
        .with_qp_access_flags(access);
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    modify(ctx, qp, init, init_mask);
    let path = AhAttr::default()
        .with_grh(GlobalRoute {
            dgid: Gid(gid),
            sgid_index: 0,
            hop_limit: 1,
            ..GlobalRoute::default()
        })
        .with_port_num(1);
    let rtr = QpAttr::default()
        .with_qp_state(QpState::Rtr)
        .with_path_mtu(mtu)
        .with_dest_qp_num(remote_qpn)
        .with_rq_psn(0)
        .with_max_dest_rd_atomic(1)
        .with_min_rnr_timer(12)
        .with_ah_attr(path);
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    modify(ctx, qp, rtr, rtr_mask);
    let rts = QpAttr::default()
        .with_qp_state(QpState::Rts)
        .with_sq_psn(0)
        .with_timeout(14)
        .with_retry_cnt(7)
        .with_rnr_retry(7)
        .with_max_rd_atomic(1);
    let rts_mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    modify(ctx, qp, rts, rts_mask);
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn a_window_cannot_be_bound_to_another_contexts_mr() {
    let device = RxeDevice::find_system(None).expect("an active rxe device");
    let gid = device.gid_table(1).unwrap().first().expect("GID 0").1.gid;
    let victim = device.open_context().unwrap();
    let attacker = device.open_context().unwrap();
    let attr = attacker.query_device().unwrap();
    println!(
        "device_cap_flags {:#x}, max_mw {}",
        attr.device_cap_flags, attr.max_mw
    );
    assert_ne!(attr.device_cap_flags & (1 << 17), 0, "IB_DEVICE_MEM_WINDOW");
    let mtu = Mtu::try_from(u32::from(attacker.query_port(1).unwrap().active_mtu)).unwrap();

    // The victim: a page registered with MW_BIND; ALLOC_MW/DEALLOC_MW of both types.
    let v_pd = victim.alloc_pd().unwrap();
    let secret = Mapping::anonymous(PAGE);
    secret.fill(0x5a);
    let v_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::MW_BIND;
    let v_mr = victim
        .reg_mr(&MrInit {
            pd: v_pd,
            start: secret.addr(),
            length: PAGE as u64,
            iova: IOVA,
            access: v_access,
        })
        .unwrap();
    for mw_type in [MwType::Type1, MwType::Type2] {
        let mw = victim.alloc_mw(v_pd, mw_type).unwrap();
        println!("victim {mw_type:?} window: {mw:?}");
        victim.dealloc_mw(mw.handle).unwrap();
    }

    // The attacker: its own PD, CQ, two connected RC QPs and a type-2 window.
    let pd = attacker.alloc_pd().unwrap();
    let landing = Mapping::anonymous(PAGE);
    let own = attacker
        .reg_mr(&MrInit {
            pd,
            start: landing.addr(),
            length: PAGE as u64,
            iova: IOVA + PAGE as u64,
            access: AccessFlags::LOCAL_WRITE,
        })
        .unwrap();
    let cq = attacker
        .create_cq(&CqInit {
            cqe: 15,
            comp_vector: 0,
            use_comp_channel: false,
            user_handle: 1,
        })
        .unwrap();
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = |user_handle| QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq.handle,
        recv_cq: cq.handle,
        srq: None,
        caps,
        sq_sig_all: false,
        user_handle,
    };
    let (qp_a, qp_b) = (
        attacker.create_qp(&init(2)).unwrap(),
        attacker.create_qp(&init(3)).unwrap(),
    );
    let ctx: &dyn HostContext = attacker.as_ref();
    let mut cq_ring = ring(ctx, cq.buffer, cq.cqe, rxe_v1::CQE_SIZE, |q| {
        CompletionQueue::new(q).unwrap()
    });
    let sq = |qp: &Qp| {
        let entry = send_wqe_size(qp.caps.max_send_sge, qp.caps.max_inline_data);
        ring(ctx, qp.sq, qp.caps.max_send_wr, entry, |q| {
            let caps = SendQueueCaps {
                qp_type: QpType::Rc,
                max_sge: qp.caps.max_send_sge,
                max_inline: qp.caps.max_inline_data,
            };
            SendQueue::new(q, caps).unwrap()
        })
    };
    let (sq_a, mut sq_b) = (sq(&qp_a), sq(&qp_b));
    connect_rc(ctx, qp_a.handle, qp_b.qpn, gid, mtu);
    connect_rc(ctx, qp_b.handle, qp_a.qpn, gid, mtu);
    let mw = attacker.alloc_mw(pd, MwType::Type2).unwrap();
    println!("attacker's window: {mw:?}; victim's MR: {v_mr:?}");

    // The control: a window of the attacker bound to the attacker's own MR (with MW_BIND) by
    // the same QP works, so a refusal below is about the MR, not the QP.
    let own_page = Mapping::anonymous(PAGE);
    let own_bindable = attacker
        .reg_mr(&MrInit {
            pd,
            start: own_page.addr(),
            length: PAGE as u64,
            iova: IOVA + 2 * PAGE as u64,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::MW_BIND,
        })
        .unwrap();
    let own_mw = attacker.alloc_mw(pd, MwType::Type2).unwrap();
    let own_bind = MwBind {
        mw_rkey: own_mw.rkey,
        rkey: inc_rkey(own_mw.rkey),
        mr_lkey: own_bindable.lkey,
        addr: IOVA + 2 * PAGE as u64,
        length: PAGE as u64,
        access: AccessFlags::REMOTE_READ,
    };
    post(
        ctx,
        qp_b.handle,
        &mut sq_b,
        SendWr::bind_mw(9, own_bind, SendFlags::SIGNALED),
    );
    let wc = poll_one(&mut cq_ring);
    println!("bind to the attacker's own MR: {wc:?}");
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw),
        "the control bind failed: the test's QP is not ready"
    );

    // B binds the attacker's window to the victim's MR, named by its lkey alone: rxe must
    // refuse (the QP then goes to error, the bind completes flushed).
    let bind = MwBind {
        mw_rkey: mw.rkey,
        rkey: inc_rkey(mw.rkey),
        mr_lkey: v_mr.lkey,
        addr: IOVA,
        length: PAGE as u64,
        access: AccessFlags::REMOTE_READ,
    };
    post(
        ctx,
        qp_b.handle,
        &mut sq_b,
        SendWr::bind_mw(1, bind, SendFlags::SIGNALED),
    );
    let wc = poll_one(&mut cq_ring);
    println!("bind to the other context's MR: {wc:?}");
    assert_ne!(
        wc.status,
        WcStatus::Success,
        "rxe bound a window to another context's MR: spec §12 must forbid memory windows"
    );

    // Windows first: a bound type-2 window holds its MR and QP.
    attacker.dealloc_mw(own_mw.handle).unwrap();
    attacker.dealloc_mw(mw.handle).unwrap();
    drop((sq_a, sq_b, cq_ring));
    attacker.destroy_qp(qp_a.handle).unwrap();
    attacker.destroy_qp(qp_b.handle).unwrap();
    attacker.destroy_cq(cq.handle).unwrap();
    attacker.dereg_mr(own_bindable.handle).unwrap();
    attacker.dereg_mr(own.handle).unwrap();
    attacker.dealloc_pd(pd).unwrap();
    victim.dereg_mr(v_mr.handle).unwrap();
    victim.dealloc_pd(v_pd).unwrap();
}

//! The host-device layer against a real rdma_rxe device (run inside the test VM, where rxe0 is
//! up and GID 0 is its IPv6 link-local address):
//!
//! `target/debug/vrdma-vm run -- target/debug/deps/device_rxe-HASH --ignored --nocapture
//! --test-threads=1`
//!
//! It creates every kind of object through the uverbs write ABI, maps the queue buffers the way
//! a frontend does (once, from the cmd fd), wraps them with the guest library's rxe provider
//! using the slot geometry the backend derives for the guest, drives an RDMA WRITE between two
//! RC QPs and a UD SEND over loopback by posting through the provider and kicking, polls the
//! completions through the provider, and checks that `rdma resource show` is back where it
//! started afterwards.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::Command;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use vrdma::provider::rxe_v1::{
    CompletionQueue, RecvQueue, RxeAddressHandle, RxeQueue, SendQueue, SendQueueCaps,
};
use vrdma::provider::{RecvWr, SendFlags, SendWr, Sge, UdDest, WorkCompletion};
use vrdma_backend::control::rings::{slot_geometry, slot_log2};
use vrdma_backend::host::*;
use vrdma_spec::attr::qp::{GlobalRoute, QpCaps};
use vrdma_spec::rxe_v1::{
    self, header, recv_wqe_size, send_wqe_size, GeometryError, RingGeometry, RxeAv,
};
use vrdma_spec::verbs::{
    AccessFlags, Gid, GidType, Mtu, QpAttrMask, QpState, QpType, WcOpcode, WcStatus, WrOpcode,
};
use vrdma_spec::wire::{AhAttr, QpAttr};
use zerocopy::FromZeros;

const PAGE: usize = 4096;
const IOVA: u64 = 0x7a00_0000_0000;
const QKEY: u32 = 0x1111_1111;
const POLL_LIMIT: Duration = Duration::from_secs(20);

/// A shared mapping: an rxe queue buffer mapped from the cmd fd, or anonymous memory.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn map_queue(fd: BorrowedFd<'_>, buffer: QueueBuffer) -> std::io::Result<Mapping> {
        let offset = libc::off_t::try_from(buffer.offset).expect("mmap offset fits off_t");
        // SAFETY: a fresh shared mapping chosen by the kernel; it aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                buffer.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        Mapping::from_mmap(ptr, buffer.len)
    }

    fn anonymous(len: usize) -> Mapping {
        // SAFETY: a fresh private anonymous mapping; it aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Mapping::from_mmap(ptr, len).expect("anonymous mmap")
    }

    fn from_mmap(ptr: *mut libc::c_void, len: usize) -> std::io::Result<Mapping> {
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned NULL"),
            len,
        })
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn read_u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.read(offset, 4).try_into().unwrap())
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: in bounds (checked above); only used on the anonymous data buffer, before the
        // work request that reads it is posted.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        }
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.len);
        let mut out = vec![0; len];
        // SAFETY: in bounds (checked above); the data buffer is read after the completion of
        // the transfer that wrote it, a queue header only before the queue is handed over.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), len)
        }
        out
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns; no references into it outlive it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A host queue buffer (SQ, RQ, SRQ or CQ) mapped once from the cmd fd, as the frontend maps
/// it, and driven by the guest library's provider with the geometry the backend tells the guest.
struct Ring<Q> {
    /// Declared before `_map` so that it is dropped before the mapping it points into.
    queue: Q,
    geometry: RingGeometry,
    /// Keeps the buffer mapped while `queue` uses it.
    _map: Mapping,
}

impl<Q> Ring<Q> {
    /// Maps `buffer`, which holds `depth` entries of `entry_bytes` (what the host reported), and
    /// wraps it with `wrap`.
    fn new(
        ctx: &dyn HostContext,
        buffer: QueueBuffer,
        depth: u32,
        entry_bytes: usize,
        wrap: impl FnOnce(RxeQueue) -> Result<Q, GeometryError>,
    ) -> Ring<Q> {
        let map = Mapping::map_queue(ctx.queue_fd(), buffer).expect("first mmap of a queue");
        // The backend's derivation (control::rings), which the guest receives in its RingDesc.
        let num_slots = depth + 1;
        let geometry = slot_geometry(buffer.len as u64, num_slots, entry_bytes)
            .unwrap_or_else(|e| panic!("{depth} x {entry_bytes} bytes in {buffer:?}: {e}"));
        assert_eq!(
            geometry.log2_slot_size(),
            slot_log2(entry_bytes),
            "rxe sizes slots as the backend predicts for {entry_bytes}-byte entries"
        );
        assert_eq!(map.read_u32(header::PRODUCER_INDEX), 0);
        assert_eq!(map.read_u32(header::CONSUMER_INDEX), 0);
        // SAFETY: the mapping is readable and writable, lives in the same `Ring` and outlives
        // the queue (field order); apart from the header reads above, which are done, only the
        // kernel and this queue access it, and each buffer is mapped (so wrapped) once.
        let queue = unsafe { RxeQueue::new(map.ptr, map.len, geometry) }
            .unwrap_or_else(|e| panic!("the real header disagrees with the backend: {e}"));
        let queue = wrap(queue).unwrap_or_else(|e| panic!("provider refuses the queue: {e}"));
        Ring {
            queue,
            geometry,
            _map: map,
        }
    }
}

impl Ring<CompletionQueue> {
    /// Takes the next completion, waiting for it.
    fn poll_one(&mut self) -> WorkCompletion {
        let start = Instant::now();
        let mut wc = [WorkCompletion::default()];
        while self.queue.poll(&mut wc) == 0 {
            assert!(start.elapsed() < POLL_LIMIT, "no completion");
            std::thread::sleep(Duration::from_millis(1));
        }
        wc[0]
    }
}

impl Ring<SendQueue> {
    fn post(&mut self, wr: SendWr<'_>) {
        assert!(!wr.flags.contains(SendFlags::INLINE));
        // SAFETY: not an inline request, so the provider dereferences none of its SGEs.
        unsafe { self.queue.post_send(&[wr]) }
            .unwrap_or_else(|(_, e)| panic!("post_send {wr:?}: {e}"));
    }
}

fn send_ring(ctx: &dyn HostContext, qp: &Qp, qp_type: QpType) -> Ring<SendQueue> {
    let caps = qp.caps;
    let entry = send_wqe_size(caps.max_send_sge, caps.max_inline_data);
    Ring::new(ctx, qp.sq, caps.max_send_wr, entry, |queue| {
        SendQueue::new(
            queue,
            SendQueueCaps {
                qp_type,
                max_sge: caps.max_send_sge,
                max_inline: caps.max_inline_data,
            },
        )
    })
}

fn recv_ring(ctx: &dyn HostContext, buffer: QueueBuffer, depth: u32, sge: u32) -> Ring<RecvQueue> {
    Ring::new(ctx, buffer, depth, recv_wqe_size(sge), |queue| {
        RecvQueue::new(queue, sge)
    })
}

/// Object counts of rxe0 from `rdma resource show`.
fn rdma_resources() -> BTreeMap<String, u64> {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("iproute2 `rdma` in the VM");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("rxe0:"))
        .unwrap_or_else(|| panic!("no rxe0 in `rdma resource show`: {text}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    words
        .chunks_exact(2)
        .map(|kv| (kv[0].to_owned(), kv[1].parse().unwrap()))
        .collect()
}

fn modify(ctx: &dyn HostContext, qp: QpHandle, attr: QpAttr, mask: QpAttrMask) {
    ctx.modify_qp(qp, &attr, mask)
        .unwrap_or_else(|e| panic!("modify_qp to {:?}: {e}", attr.qp_state()));
}

/// The address vector to `gid` on port 1 from GID 0, one hop.
fn loopback_path(gid: [u8; 16]) -> AhAttr {
    AhAttr::default()
        .with_grh(GlobalRoute {
            dgid: Gid(gid),
            sgid_index: 0,
            hop_limit: 1,
            ..GlobalRoute::default()
        })
        .with_port_num(1)
}

fn connect_rc(ctx: &dyn HostContext, qp: QpHandle, remote_qpn: u32, gid: [u8; 16], mtu: u8) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mtu = Mtu::try_from(u32::from(mtu)).expect("rxe reports a defined MTU");
    modify(
        ctx,
        qp,
        QpAttr::default()
            .with_qp_state(QpState::Init)
            .with_pkey_index(0)
            .with_port_num(1)
            .with_qp_access_flags(access),
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    );
    modify(
        ctx,
        qp,
        QpAttr::default()
            .with_qp_state(QpState::Rtr)
            .with_path_mtu(mtu)
            .with_dest_qp_num(remote_qpn)
            .with_rq_psn(0x100)
            .with_max_dest_rd_atomic(1)
            .with_min_rnr_timer(12)
            .with_ah_attr(loopback_path(gid)),
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    );
    modify(
        ctx,
        qp,
        QpAttr::default()
            .with_qp_state(QpState::Rts)
            .with_sq_psn(0x100)
            .with_timeout(14)
            .with_retry_cnt(7)
            .with_rnr_retry(7)
            .with_max_rd_atomic(1),
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    );
}

fn activate_ud(ctx: &dyn HostContext, qp: QpHandle) {
    modify(
        ctx,
        qp,
        QpAttr::default()
            .with_qp_state(QpState::Init)
            .with_port_num(1)
            .with_qkey(QKEY),
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    );
    modify(
        ctx,
        qp,
        QpAttr::default().with_qp_state(QpState::Rtr),
        QpAttrMask::STATE,
    );
    modify(
        ctx,
        qp,
        QpAttr::default()
            .with_qp_state(QpState::Rts)
            .with_sq_psn(0x200),
        QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    );
}

fn wait_comp_event(ctx: &dyn HostContext) -> CompEvent {
    let start = Instant::now();
    loop {
        if let Some(event) = ctx.read_comp_event().unwrap() {
            return event;
        }
        assert!(start.elapsed() < POLL_LIMIT, "no completion event");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn missing_device_name_is_reported() {
    let err = RxeDevice::find_system(Some("nosuch0")).unwrap_err();
    println!("find(nosuch0): {err}");
    assert!(matches!(err, DeviceError::DeviceNotFound { .. }));
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn rxe_host_path_end_to_end() {
    let before = rdma_resources();
    println!("rdma resource show before: {before:?}");

    let device = RxeDevice::find_system(None).expect("an active rxe device");
    println!("device: {:?}", device.info());
    assert_eq!(device.info().name, "rxe0");
    assert_eq!(device.ring_format(), 1);
    let gids = device.gid_table(1).unwrap();
    println!("gid table: {gids:?}");
    let (gid0_index, gid0) = gids.first().expect("GID 0");
    assert_eq!(*gid0_index, 0);
    assert_eq!(
        &gid0.gid[..2],
        &[0xfe, 0x80],
        "GID 0 is the IPv6 link-local address"
    );
    assert_eq!(gid0.gid_type(), Ok(GidType::RoceV2));
    let gid = gid0.gid;

    let boxed = device.open_context().unwrap();
    let ctx: &dyn HostContext = boxed.as_ref();
    let attr = ctx.query_device().unwrap();
    println!("device attr: {attr:?}");
    assert_eq!(attr.vendor_id, 0xff_ffff);
    assert_eq!(attr.phys_port_cnt, 1);
    assert!(attr.max_qp > 0 && attr.max_qp_wr > 0 && attr.max_cqe > 0);
    let port = ctx.query_port(1).unwrap();
    println!("port attr: {port:?}");
    assert_eq!(port.state, 4, "ACTIVE");
    assert_eq!(port.link_layer, 2, "Ethernet");
    assert!(port.gid_tbl_len as usize > gids.len() - 1);
    assert!(ctx.query_port(2).is_err(), "rxe has one port");
    assert!(ctx.num_comp_vectors() >= 1);

    let pd = ctx.alloc_pd().unwrap();
    // One buffer: source page, then destination page; registered at an iova unrelated to its
    // address in this process, as the backend registers guest memory.
    let buf = Mapping::anonymous(2 * PAGE);
    let mr = ctx
        .reg_mr(&MrInit {
            pd,
            start: buf.addr(),
            length: 2 * PAGE as u64,
            iova: IOVA,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        })
        .unwrap();
    println!("mr: {mr:?}");

    let cq = ctx
        .create_cq(&CqInit {
            cqe: 15,
            comp_vector: 0,
            use_comp_channel: true,
            user_handle: 0xc0ffee,
        })
        .unwrap();
    println!("cq: {cq:?}");
    assert!(cq.cqe >= 15);
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp_init = |qp_type, user_handle| QpInit {
        qp_type,
        pd,
        send_cq: cq.handle,
        recv_cq: cq.handle,
        srq: None,
        caps,
        sq_sig_all: false,
        user_handle,
    };
    let rc_a = ctx.create_qp(&qp_init(QpType::Rc, 1)).unwrap();
    let rc_b = ctx.create_qp(&qp_init(QpType::Rc, 2)).unwrap();
    let ud = ctx.create_qp(&qp_init(QpType::Ud, 3)).unwrap();
    println!("qps: {rc_a:?}\n     {rc_b:?}\n     {ud:?}");
    assert!(rc_a.caps.max_send_wr >= 8 && rc_a.rq.is_some());
    let srq = ctx
        .create_srq(&SrqInit {
            pd,
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
            user_handle: 4,
        })
        .unwrap();
    println!("srq: {srq:?}");
    let ah = ctx
        .create_ah(&AhInit {
            pd,
            attr: loopback_path(gid),
            user_handle: 5,
        })
        .unwrap();
    println!("ah: {ah:?}");
    assert_ne!(ah.ah_num, 0);
    let during = rdma_resources();
    println!("rdma resource show during: {during:?}");
    assert_eq!(during["qp"], before["qp"] + 3);
    assert_eq!(during["cq"], before["cq"] + 1);
    assert_eq!(during["pd"], before["pd"] + 1);
    assert_eq!(during["mr"], before["mr"] + 1);
    assert_eq!(during["srq"], before["srq"] + 1);
    assert_eq!(during["ctx"], before["ctx"] + 1);

    // Map every queue once, as the frontend does, and wrap it as the guest does: the provider
    // checks the real rxe header against the geometry the backend derives.
    let mut cq_ring = Ring::new(
        ctx,
        cq.buffer,
        cq.cqe,
        rxe_v1::CQE_SIZE,
        CompletionQueue::new,
    );
    let mut sq_a = send_ring(ctx, &rc_a, QpType::Rc);
    let rq_a = recv_ring(
        ctx,
        rc_a.rq.unwrap(),
        rc_a.caps.max_recv_wr,
        rc_a.caps.max_recv_sge,
    );
    let mut ud_sq = send_ring(ctx, &ud, QpType::Ud);
    let mut ud_rq = recv_ring(
        ctx,
        ud.rq.unwrap(),
        ud.caps.max_recv_wr,
        ud.caps.max_recv_sge,
    );
    let srq_ring = recv_ring(ctx, srq.buffer, srq.max_wr, srq.max_sge);
    assert!(cq_ring.queue.capacity() >= cq.cqe);
    assert!(sq_a.queue.capacity() >= rc_a.caps.max_send_wr);
    assert!(srq_ring.queue.capacity() >= srq.max_wr);
    println!(
        "cq ring: {:?}; rc sq: {:?}; rc rq: {:?}; srq: {:?}",
        cq_ring.geometry, sq_a.geometry, rq_a.geometry, srq_ring.geometry
    );
    let again = Mapping::map_queue(ctx.queue_fd(), cq.buffer);
    println!("second mmap of the CQ buffer: {:?}", again.as_ref().err());
    assert!(again.is_err(), "rxe queue buffers map only once");

    ctx.modify_srq(
        srq.handle,
        &SrqModify {
            max_wr: None,
            srq_limit: Some(4),
        },
    )
    .unwrap();

    // RDMA WRITE from rc_a (source page) to rc_b (destination page) over rxe0 loopback.
    let mtu = port.active_mtu;
    connect_rc(ctx, rc_a.handle, rc_b.qpn, gid, mtu);
    connect_rc(ctx, rc_b.handle, rc_a.qpn, gid, mtu);
    let info = ctx.query_qp(rc_a.handle, QpAttrMask::LEGACY_ALL).unwrap();
    println!("query_qp(rc_a): {info:?}");
    assert_eq!(info.attr.qp_state(), Ok(QpState::Rts));
    assert_eq!(info.attr.dest_qp_num.get(), rc_b.qpn);
    assert_eq!(info.attr.ah_attr.dgid, gid);
    assert_eq!(info.attr.sq_psn.get(), 0x100);

    let payload: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
    buf.write(0, &payload);
    ctx.req_notify_cq(cq.handle, false).unwrap();
    let src = [Sge {
        addr: IOVA,
        length: payload.len() as u32,
        lkey: mr.lkey,
    }];
    sq_a.post(SendWr {
        wr_id: 0x1234,
        opcode: WrOpcode::RdmaWrite,
        flags: SendFlags::SIGNALED,
        sg_list: &src,
        remote_addr: IOVA + PAGE as u64,
        rkey: mr.rkey,
        ..Default::default()
    });
    ctx.kick_send(rc_a.handle).unwrap();
    let wc = cq_ring.poll_one();
    println!("rdma write completion: {wc:?}");
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::RdmaWrite);
    assert_eq!(wc.wr_id, 0x1234);
    assert_eq!(wc.qp_num, rc_a.qpn);
    assert_eq!(buf.read(PAGE, payload.len()), payload, "data arrived");
    let event = wait_comp_event(ctx);
    println!("completion event: {event:?}");
    assert_eq!(event.cq_user_handle, 0xc0ffee);

    // UD SEND from the UD QP to itself through the AH's ah_num.
    activate_ud(ctx, ud.handle);
    let recv_at = IOVA + PAGE as u64 + 1024;
    let recv_sge = [Sge {
        addr: recv_at,
        length: 40 + 64,
        lkey: mr.lkey,
    }];
    ud_rq
        .queue
        .post_recv(&[RecvWr {
            wr_id: 0x5678,
            sg_list: &recv_sge,
        }])
        .unwrap_or_else(|(_, e)| panic!("post_recv: {e}"));
    let ah_handle = RxeAddressHandle {
        ah_num: ah.ah_num,
        av: RxeAv::new_zeroed(),
    };
    let send_sge = [Sge {
        addr: IOVA,
        length: 64,
        lkey: mr.lkey,
    }];
    ud_sq.post(SendWr {
        wr_id: 0x9abc,
        opcode: WrOpcode::Send,
        flags: SendFlags::SIGNALED,
        sg_list: &send_sge,
        ud: Some(UdDest {
            ah: &ah_handle,
            remote_qpn: ud.qpn,
            remote_qkey: QKEY,
        }),
        ..Default::default()
    });
    ctx.kick_send(ud.handle).unwrap();
    let mut wcs = [cq_ring.poll_one(), cq_ring.poll_one()];
    wcs.sort_by_key(|w| w.wr_id);
    println!("ud completions: {wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (0x5678, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wcs[0].byte_len, 40 + 64, "GRH + payload");
    assert_eq!(wcs[0].src_qp, ud.qpn);
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status, wcs[1].opcode),
        (0x9abc, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(
        buf.read(PAGE + 1024 + 40, 64),
        payload[..64],
        "UD payload after the GRH"
    );
    while let Some(event) = ctx.read_async_event().unwrap() {
        println!("async event: {event:?}");
    }

    // Tear down explicitly; the context drop then has nothing left to destroy.
    drop((cq_ring, sq_a, rq_a, ud_sq, ud_rq, srq_ring));
    ctx.destroy_ah(ah.handle).unwrap();
    ctx.destroy_qp(rc_a.handle).unwrap();
    ctx.destroy_qp(rc_b.handle).unwrap();
    ctx.destroy_qp(ud.handle).unwrap();
    ctx.destroy_srq(srq.handle).unwrap();
    ctx.destroy_cq(cq.handle).unwrap();
    ctx.dereg_mr(mr.handle).unwrap();
    ctx.dealloc_pd(pd).unwrap();
    assert!(
        ctx.dealloc_pd(pd).is_err(),
        "stale handle refused by the kernel"
    );
    drop(boxed);

    let after = rdma_resources();
    println!("rdma resource show after: {after:?}");
    assert_eq!(after, before);
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn dropping_a_context_releases_everything() {
    let before = rdma_resources();
    let device = RxeDevice::find_system(Some("rxe0")).unwrap();
    let ctx = device.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let buf = Mapping::anonymous(PAGE);
    ctx.reg_mr(&MrInit {
        pd,
        start: buf.addr(),
        length: PAGE as u64,
        iova: IOVA,
        access: AccessFlags::LOCAL_WRITE,
    })
    .unwrap();
    let cq = ctx
        .create_cq(&CqInit {
            cqe: 4,
            comp_vector: 0,
            use_comp_channel: false,
            user_handle: 1,
        })
        .unwrap();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    ctx.create_qp(&QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq.handle,
        recv_cq: cq.handle,
        srq: None,
        caps,
        sq_sig_all: true,
        user_handle: 2,
    })
    .unwrap();
    assert_ne!(rdma_resources(), before);
    drop(ctx);
    assert_eq!(rdma_resources(), before);
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn the_whole_table_in_one_call_equals_sysfs() {
    let device = RxeDevice::find_system(Some("rxe0")).unwrap();
    let ctx = device.open_context().unwrap();
    let sysfs = device.gid_table(1).unwrap();
    let one_call = ctx
        .gid_table(1)
        .unwrap()
        .expect("Linux 6.12 has UVERBS_METHOD_QUERY_GID_TABLE");
    println!("gid table: sysfs {sysfs:?}, one call {one_call:?}");
    assert!(!sysfs.is_empty());
    assert_eq!(one_call, sysfs);
    // Port 2 does not exist: no entries, not port 1's.
    assert_eq!(ctx.gid_table(2).unwrap(), Some(Vec::new()));
    // Through the guest's source: the same.
    let source = ContextGids {
        device: &device,
        context: ctx.as_ref(),
    };
    assert_eq!(source.gid_table(1).unwrap(), sysfs);
}

#[test]
#[ignore = "needs rdma_rxe: run in the VM"]
fn single_entries_in_one_call_equal_sysfs() {
    let device = RxeDevice::find_system(Some("rxe0")).unwrap();
    let ctx = device.open_context().unwrap();
    let populated = device.gid_table(1).unwrap();
    assert!(!populated.is_empty());
    let last = populated.iter().map(|(i, _)| *i).max().unwrap();
    // Every populated entry and the empty slots between and after them.
    for index in 0..=last + 2 {
        let sysfs = device.gid_entry(1, index).unwrap();
        let one_call = ctx
            .gid_entry(1, index)
            .unwrap()
            .expect("Linux 6.12 has UVERBS_METHOD_QUERY_GID_ENTRY");
        assert_eq!(one_call, sysfs, "entry {index}");
    }
    // Beyond the table the kernel answers EINVAL: left to sysfs, which has no such entry.
    assert_eq!(ctx.gid_entry(1, 100_000).unwrap(), None);
    let source = ContextGids {
        device: &device,
        context: ctx.as_ref(),
    };
    assert_eq!(source.gid_entry(1, 100_000).unwrap(), None);
    for (index, entry) in &populated {
        assert_eq!(source.gid_entry(1, *index).unwrap(), Some(*entry));
    }
}

//! Send batches (the `ibv_wr_*` way of posting) on the rxe v1 send queue against the simulated
//! Soft-RoCE kernel: a batch writes the same WQE bytes `post_send` writes for the same
//! requests (memory-window binds and invalidations included), publishes all of them at once, and publishes nothing when one is refused. Each
//! test runs for a mapped and for an accessed queue.

use std::mem::offset_of;
use std::sync::atomic::Ordering;

use vrdma::provider::rxe_v1::{SendBatchState, SendQueue, SendQueueCaps};
use vrdma::provider::{MwBind, PostError, SendFlags, SendWr, Sge};
use vrdma_spec::rxe_v1::{RxeDmaInfo, RxeSendWqe};
use vrdma_spec::verbs::{AccessFlags, QpType, WrOpcode};
use vrdma_test_support::for_both_reaches;
use vrdma_test_support::rxe_kernel_sim::{sge_of, Reach, SharedQueue};

const LOG2_SLOT: u32 = 9;

/// Something done to the current request of a batch that gets it refused.
type Refusal<'a> = dyn Fn(&mut SendQueue, &mut SendBatchState) + 'a;

fn send_queue(shared: &SharedQueue, qp_type: QpType) -> SendQueue {
    let caps = SendQueueCaps {
        qp_type,
        max_sge: 4,
        max_inline: 256,
    };
    SendQueue::new(shared.queue(), caps).unwrap()
}

/// Posts `wrs` as one batch, the payload of each given by the setter `ibv_wr_*` would use.
fn post_batch(sq: &mut SendQueue, wrs: &[SendWr<'_>]) -> Result<usize, (usize, PostError)> {
    let mut batch = sq.batch_begin();
    for wr in wrs {
        sq.batch_add(&mut batch, wr);
        if wr.flags.contains(SendFlags::INLINE) {
            let chunks = wr
                .sg_list
                .iter()
                .map(|s| (s.addr as usize as *const u8, s.length as usize));
            // SAFETY: the inline SGEs of these tests point into live local buffers.
            unsafe { sq.batch_set_inline(&mut batch, chunks) };
        } else if !wr.sg_list.is_empty() {
            sq.batch_set_sges(&mut batch, wr.sg_list);
        }
    }
    sq.batch_publish(batch)
}

/// The bytes of slot `index` the driver writes: the WQE and `payload` bytes after it, with the
/// SGE count of an inline request cleared (rdma-core's `ibv_post_send` counts the inline
/// buffers there, its `ibv_wr_set_inline_data` leaves 0; the kernel ignores it).
fn written(shared: &SharedQueue, index: u32, payload: usize) -> Vec<u8> {
    let k = shared.kernel();
    let mut bytes = k.payload(index, 0, size_of::<RxeSendWqe>() + payload);
    let wqe = k.send_wqe(index);
    if wqe.wr.send_flags.get() & SendFlags::INLINE.bits() != 0 {
        let at = offset_of!(RxeSendWqe, dma) + offset_of!(RxeDmaInfo, num_sge);
        bytes[at..at + 4].fill(0);
    }
    bytes
}

fn batches_write_what_post_send_writes(reach: Reach) {
    let (classic, batched) = (
        SharedQueue::new(reach, 16, LOG2_SLOT),
        SharedQueue::new(reach, 16, LOG2_SLOT),
    );
    classic.kernel().mark_kernel_owned();
    batched.kernel().mark_kernel_owned();
    let (mut a, mut b) = (
        send_queue(&classic, QpType::Rc),
        send_queue(&batched, QpType::Rc),
    );
    let data = [5u8; 64];
    let inline_a = *b"inline ";
    let inline_b = *b"payload";
    let two = [sge_of(&data[..40], 3), sge_of(&data[40..], 4)];
    let inline = [sge_of(&inline_a, 0), sge_of(&inline_b, 0)];
    let eight = [sge_of(&data[..8], 5)];
    let signaled = SendFlags::SIGNALED;
    let bind = MwBind {
        mw_rkey: 0x4200,
        rkey: 0x4201,
        mr_lkey: 0x33,
        addr: 0x7000,
        length: 4096,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    };
    let wrs = [
        SendWr {
            wr_id: 1,
            opcode: WrOpcode::Send,
            flags: signaled | SendFlags::SOLICITED,
            sg_list: &two,
            ..Default::default()
        },
        SendWr {
            wr_id: 2,
            opcode: WrOpcode::SendWithImm,
            flags: SendFlags::INLINE,
            sg_list: &inline,
            imm_data: 0x0102_0304u32.to_be(),
            ..Default::default()
        },
        SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaWriteWithImm,
            flags: signaled | SendFlags::FENCE,
            sg_list: &two,
            imm_data: 9u32.to_be(),
            remote_addr: 0x7000,
            rkey: 0x77,
            ..Default::default()
        },
        SendWr {
            wr_id: 4,
            opcode: WrOpcode::RdmaRead,
            flags: signaled,
            sg_list: &two[..1],
            remote_addr: 0x8000,
            rkey: 0x88,
            ..Default::default()
        },
        SendWr {
            wr_id: 5,
            opcode: WrOpcode::AtomicCmpAndSwp,
            flags: signaled,
            sg_list: &eight,
            remote_addr: 0x9000,
            rkey: 0x99,
            compare_add: 1,
            swap: 2,
            ..Default::default()
        },
        SendWr {
            wr_id: 6,
            opcode: WrOpcode::AtomicFetchAndAdd,
            flags: signaled,
            sg_list: &eight,
            remote_addr: 0x9008,
            rkey: 0x99,
            compare_add: 3,
            ..Default::default()
        },
        SendWr {
            wr_id: 7,
            opcode: WrOpcode::RdmaWrite,
            flags: signaled,
            sg_list: &[],
            remote_addr: 0xa000,
            rkey: 0xaa,
            ..Default::default()
        },
        SendWr::bind_mw(8, bind, signaled | SendFlags::FENCE),
        SendWr::local_inv(9, 0x4201, signaled),
        SendWr::send_with_inv(10, &two, 0x4201, signaled),
        SendWr {
            wr_id: 11,
            opcode: WrOpcode::AtomicWrite,
            flags: signaled,
            remote_addr: 0xb000,
            rkey: 0xbb,
            compare_add: u64::from_ne_bytes(*b"atomicwr"),
            ..Default::default()
        },
        SendWr {
            wr_id: 12,
            opcode: WrOpcode::Flush,
            flags: signaled,
            remote_addr: 0xc000,
            rkey: 0xcc,
            flush: vrdma::provider::FlushRange {
                length: 4096,
                flush_type: 2,
                level: 1,
            },
            ..Default::default()
        },
    ];
    // SAFETY: the inline SGEs point into live local buffers.
    unsafe { a.post_send(&wrs) }.unwrap();
    assert_eq!(post_batch(&mut b, &wrs), Ok(wrs.len()));
    assert_eq!(
        batched.kernel().producer().load(Ordering::Acquire),
        wrs.len() as u32
    );
    for (i, wr) in wrs.iter().enumerate() {
        let payload = if wr.flags.contains(SendFlags::INLINE) {
            inline_a.len() + inline_b.len()
        } else {
            wr.sg_list.len() * 16 + wr.opcode.wqe_operand_len()
        };
        let i = i as u32;
        assert_eq!(
            written(&batched, i, payload),
            written(&classic, i, payload),
            "WQE {i}"
        );
    }
    // The window fields are there (not zeros on both sides).
    let k = batched.kernel();
    let mw = k.send_wqe(7).wr.wr.mw();
    let fields = (mw.mw_rkey.get(), mw.rkey.get(), mw.mr_lkey.get());
    assert_eq!(fields, (0x4200, 0x4201, 0x33));
    assert_eq!(
        (mw.addr.get(), mw.length.get(), mw.access.get()),
        (0x7000, 4096, 0x6)
    );
    for i in [8, 9] {
        assert_eq!(k.send_wqe(i).wr.ex, 0x4201u32.to_le_bytes(), "WQE {i}");
    }
    // ATOMIC_WRITE's operand is there too, with its length.
    assert_eq!(k.payload(10, size_of::<RxeSendWqe>(), 8), b"atomicwr");
    assert_eq!(k.send_wqe(10).dma.length.get(), 8);
}

fn a_refused_request_publishes_nothing(reach: Reach) {
    let shared = SharedQueue::new(reach, 4, LOG2_SLOT);
    let k = shared.kernel();
    let mut sq = send_queue(&shared, QpType::Uc);
    let data = [1u8; 600];
    let send = SendWr {
        wr_id: 1,
        sg_list: &[],
        ..Default::default()
    };
    let sge = sge_of(&data[..8], 1);
    // Each refusal follows a complete request and a started one: a refused setter names the
    // started request (1), a refused opcode, or a request refused once complete, the one it
    // started (2).
    let refusals: [(&Refusal<'_>, PostError); 7] = [
        // RDMA READ on UC.
        (
            &|sq, b| {
                sq.batch_add(
                    b,
                    &SendWr {
                        opcode: WrOpcode::RdmaRead,
                        ..send
                    },
                )
            },
            PostError::OpcodeNotSupported {
                opcode: WrOpcode::RdmaRead,
                qp_type: QpType::Uc,
            },
        ),
        (
            &|sq, b| sq.batch_set_sges(b, &[sge; 5]),
            PostError::TooManySges { num: 5, max: 4 },
        ),
        (
            // SAFETY: the chunk is a live local buffer.
            &|sq, b| unsafe { sq.batch_set_inline(b, [(data.as_ptr(), 257)].into_iter()) },
            PostError::InlineTooLong { len: 257, max: 256 },
        ),
        (
            &|sq, b| {
                sq.batch_set_ud_dest(
                    b,
                    &vrdma::provider::UdDest {
                        ah: &vrdma::provider::rxe_v1::RxeAddressHandle {
                            ah_num: 1,
                            av: zerocopy::FromZeros::new_zeroed(),
                        },
                        remote_qpn: 1,
                        remote_qkey: 1,
                    },
                )
            },
            PostError::UnexpectedUdDest,
        ),
        (
            &|sq, b| {
                let big = Sge {
                    addr: 0,
                    length: u32::MAX,
                    lkey: 1,
                };
                sq.batch_set_sges(b, &[big, big])
            },
            PostError::MessageTooLong(2 * u64::from(u32::MAX)),
        ),
        // A BIND_MW without its bind, and one with a payload.
        (
            &|sq, b| {
                let no_bind = SendWr {
                    opcode: WrOpcode::BindMw,
                    ..send
                };
                sq.batch_add(b, &no_bind)
            },
            PostError::InvalidBind,
        ),
        (
            &|sq, b| {
                let bind = SendWr::bind_mw(2, MwBind::default(), SendFlags::SIGNALED);
                sq.batch_add(b, &bind);
                sq.batch_set_sges(b, &[sge]);
            },
            PostError::UnexpectedSges(WrOpcode::BindMw),
        ),
    ];
    for (refuse, error) in refusals {
        let mut batch = sq.batch_begin();
        sq.batch_add(&mut batch, &send);
        sq.batch_set_sges(&mut batch, &[sge]);
        sq.batch_add(&mut batch, &send);
        refuse(&mut sq, &mut batch);
        // Ignored after the refusal.
        sq.batch_add(&mut batch, &send);
        let started_by_refusal = matches!(
            error,
            PostError::OpcodeNotSupported { .. }
                | PostError::InvalidBind
                | PostError::UnexpectedSges(_)
        );
        let refused = if started_by_refusal { 2 } else { 1 };
        assert_eq!(sq.batch_publish(batch), Err((refused, error)));
        assert_eq!(k.producer().load(Ordering::Acquire), 0);
    }
    // A setter with no request started.
    let mut batch = sq.batch_begin();
    sq.batch_set_sges(&mut batch, &[sge]);
    assert_eq!(sq.batch_publish(batch), Err((0, PostError::NoRequest)));
    // A full queue (3 usable slots of 4), then a dropped (aborted) batch: nothing published.
    let mut batch = sq.batch_begin();
    for _ in 0..4 {
        sq.batch_add(&mut batch, &send);
    }
    assert_eq!(sq.batch_publish(batch), Err((3, PostError::QueueFull)));
    let mut aborted = sq.batch_begin();
    sq.batch_add(&mut aborted, &send);
    // Never published: the batch is abandoned, as `ibv_wr_abort` abandons it.
    assert_eq!(k.producer().load(Ordering::Acquire), 0);
    // The queue is intact: three requests fit and are published together.
    let mut batch = sq.batch_begin();
    for _ in 0..3 {
        sq.batch_add(&mut batch, &send);
    }
    assert_eq!(sq.batch_publish(batch), Ok(3));
    assert_eq!(k.producer().load(Ordering::Acquire), 3);
}

for_both_reaches!(
    batches_write_what_post_send_writes,
    a_refused_request_publishes_nothing,
);

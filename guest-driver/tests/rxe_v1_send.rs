//! The rxe v1 send queue against the simulated Soft-RoCE kernel
//! ([`vrdma_test_support::rxe_kernel_sim`]): every field of every kind of send WQE, refusals,
//! a full queue, a kernel thread consuming many wraps, and the accesses of a queue reached
//! through a [`RegionAccess`](vrdma::transport::RegionAccess). Each test taking a [`Reach`]
//! runs for a mapped and for an accessed queue.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use vrdma::provider::rxe_v1::{CompletionQueue, RxeAddressHandle, SendQueue, SendQueueCaps};
use vrdma::provider::{
    FlushRange, MwBind, PostError, SendFlags, SendWr, Sge, UdDest, WorkCompletion,
};
use vrdma_spec::rxe_v1::{IbUverbsWc, RxeAv, RxeSendWqe};
use vrdma_spec::verbs::{AccessFlags, QpType, WcOpcode, WcStatus, WrOpcode};
use vrdma_spec::{Le16, Le32};
use vrdma_test_support::for_both_reaches;
use vrdma_test_support::rxe_kernel_sim::{
    complete_sends, rxe_sges, sge_of, Access, KernelSide, Reach, SharedQueue, DEADLINE,
    KERNEL_OWNED,
};
use zerocopy::{FromZeros, IntoBytes};

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

/// Checks the fields every send WQE shares.
fn check_common(wqe: &RxeSendWqe, wr: &SendWr<'_>, length: u32) {
    assert_eq!(wqe.wr.wr_id.get(), wr.wr_id);
    assert_eq!(wqe.wr.reserved.get(), 0);
    assert_eq!(wqe.wr.opcode.get(), wr.opcode as u32);
    assert_eq!(wqe.wr.send_flags.get(), wr.flags.bits());
    let ex = if wr.opcode.has_imm() {
        u32::from_ne_bytes(wr.imm_data.to_ne_bytes())
    } else if wr.opcode.has_invalidate() {
        wr.invalidate_rkey
    } else {
        0
    };
    assert_eq!(u32::from_le_bytes(wqe.wr.ex), ex);
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
fn check_kernel_fields(wqe: &RxeSendWqe, reach: Reach) {
    let want = match reach {
        Reach::Mapped => KERNEL_OWNED,
        Reach::Accessed => 0,
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

fn rc_send_wqes_carry_every_field(reach: Reach) {
    let shared = SharedQueue::new(reach, 16, 9);
    let k = shared.kernel();
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
        SendWr {
            // Ignored without INV.
            imm_data: 5,
            ..SendWr::local_inv(108, 0x1234_5601, signaled)
        },
        SendWr::bind_mw(
            109,
            MwBind {
                mw_rkey: 0x0000_4280,
                rkey: 0x0000_4281,
                mr_lkey: 0x0000_3300,
                addr: 0x7f00_0000_2000,
                length: 0x1_0000_0000,
                access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            },
            SendFlags::FENCE,
        ),
        SendWr::send_with_inv(110, &sgl3, 0xfeed_0001, signaled),
        SendWr {
            wr_id: 111,
            opcode: WrOpcode::AtomicWrite,
            flags: signaled,
            remote_addr: 0x3008,
            rkey: 10,
            compare_add: u64::from_ne_bytes(*b"8 bytes!"),
            ..Default::default()
        },
        SendWr {
            wr_id: 112,
            opcode: WrOpcode::Flush,
            flags: signaled,
            remote_addr: 0x4000,
            rkey: 11,
            flush: FlushRange {
                length: 12345,
                flush_type: 1,
                level: 0,
            },
            ..Default::default()
        },
    ];
    post(&mut sq, &wrs).unwrap();
    assert_eq!(k.producer().load(Ordering::Acquire), wrs.len() as u32);

    for (i, wr) in wrs.iter().enumerate() {
        let wqe = k.send_wqe(i as u32);
        check_kernel_fields(&wqe, reach);
        let length: u32 = wr.sg_list.iter().map(|s| s.length).sum::<u32>()
            + wr.opcode.wqe_operand_len() as u32
            + wr.flush.length as u32;
        check_common(&wqe, wr, length);
        let union = wqe.wr.wr.bytes;
        match wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv | WrOpcode::LocalInv => {
                assert_eq!(union, [0; 120]);
                assert_eq!(wqe.iova.get(), 0);
            }
            WrOpcode::BindMw => {
                let mw = wqe.wr.wr.mw();
                assert_eq!(
                    (mw.addr.get(), mw.length.get()),
                    (0x7f00_0000_2000, 0x1_0000_0000)
                );
                assert_eq!(
                    (
                        mw.mr_lkey.get(),
                        mw.mw_rkey.get(),
                        mw.rkey.get(),
                        mw.access.get()
                    ),
                    (0x3300, 0x4280, 0x4281, 0x6)
                );
                assert_eq!(union[32..], [0; 88]);
                assert_eq!(wqe.iova.get(), 0);
            }
            WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm
            | WrOpcode::RdmaRead
            | WrOpcode::AtomicWrite => {
                let rdma = wqe.wr.wr.rdma();
                assert_eq!(
                    (rdma.remote_addr.get(), rdma.rkey.get(), rdma.reserved.get()),
                    (wr.remote_addr, wr.rkey, 0)
                );
                assert_eq!(union[16..], [0; 104]);
                assert_eq!(wqe.iova.get(), wr.remote_addr);
            }
            WrOpcode::Flush => {
                let flush = wqe.wr.wr.flush();
                assert_eq!(
                    (
                        flush.remote_addr.get(),
                        flush.rkey.get(),
                        flush.length.get()
                    ),
                    (0x4000, 11, 0),
                    "the range's length is dma.length"
                );
                assert_eq!((flush.flush_type, flush.level), (1, 0));
                assert_eq!(union[18..], [0; 102]);
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
        if wr.opcode == WrOpcode::AtomicWrite {
            // rxe's `dma.atomic_wr`: the 8 bytes, in memory order, where SGEs would be.
            assert_eq!(k.payload(i as u32, 208, 8), b"8 bytes!");
        } else if wr.flags.contains(SendFlags::INLINE) {
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

fn ud_sends_name_the_ah_or_carry_the_av(reach: Reach) {
    let shared = SharedQueue::new(reach, 8, 9);
    let k = shared.kernel();
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
    let atomic_write = SendWr {
        opcode: WrOpcode::AtomicWrite,
        sg_list: &[],
        ..wr(4, &new_kernel_ah, WrOpcode::AtomicWrite, &sgl)
    };
    assert_eq!(
        post(&mut sq, &[atomic_write]),
        Err((
            0,
            PostError::OpcodeNotSupported {
                opcode: WrOpcode::AtomicWrite,
                qp_type: QpType::Ud
            }
        ))
    );
    assert_eq!(k.producer().load(Ordering::Acquire), 2);
}

fn refusals_say_how_many_were_posted(reach: Reach) {
    let shared = SharedQueue::new(reach, 32, 9);
    let k = shared.kernel();
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
    let cases: [(SendWr<'_>, PostError); 10] = [
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
        (
            // ATOMIC_WRITE carries its 8 bytes itself: no SGEs, no inline data.
            SendWr {
                opcode: WrOpcode::AtomicWrite,
                sg_list: &small_sgl,
                ..ok
            },
            PostError::UnexpectedSges(WrOpcode::AtomicWrite),
        ),
        (
            SendWr {
                opcode: WrOpcode::AtomicWrite,
                flags: SendFlags::INLINE,
                ..ok
            },
            PostError::InlineNotAllowed(WrOpcode::AtomicWrite),
        ),
        (
            // A FLUSH names a remote range only.
            SendWr {
                opcode: WrOpcode::Flush,
                sg_list: &small_sgl,
                ..ok
            },
            PostError::UnexpectedSges(WrOpcode::Flush),
        ),
    ];
    let mut posted = 0;
    for (bad, want) in cases {
        let wrs = [ok, ok, bad, ok];
        assert_eq!(post(&mut sq, &wrs), Err((2, want)));
        posted += 2;
        assert_eq!(k.producer().load(Ordering::Acquire), posted);
        // Keep the queue from filling up: the "kernel" consumes everything.
        k.consumer().store(posted & 31, Ordering::Release);
    }
}

fn full_queue_refuses_without_overwriting(reach: Reach) {
    let shared = SharedQueue::new(reach, 4, 9);
    let k = shared.kernel();
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

/// The simulated kernel's work for the threaded test's WQE number `i`, in slot `index`: checks
/// every field against the request posted as number `i`, and completes it if it was signaled.
fn check_nth_wqe(i: u64, sq: &KernelSide, index: u32) -> Option<IbUverbsWc> {
    let mut sgl = [Sge::default(); 3];
    let mut inline = [0u8; 48];
    let want = nth_wr(i, &mut sgl, &mut inline);
    let wqe = sq.send_wqe(index);
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
        assert_eq!(sq.payload(index, 208, n), inline[..n]);
    } else {
        assert_eq!(
            sq.sges(index, 208, want.sg_list.len()),
            rxe_sges(want.sg_list)
        );
    }
    if !want.flags.contains(SendFlags::SIGNALED) {
        return None;
    }
    let opcode = match want.opcode {
        WrOpcode::RdmaRead => WcOpcode::RdmaRead,
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
        _ => WcOpcode::Send,
    };
    Some(IbUverbsWc {
        wr_id: wqe.wr.wr_id,
        opcode: Le32::new(opcode.raw()),
        byte_len: wqe.dma.length,
        qp_num: Le32::new(17),
        ..IbUverbsWc::new_zeroed()
    })
}

fn threaded_kernel_sees_every_request_across_many_wraps(reach: Reach) {
    const TOTAL: u64 = 20_000;
    let sq_shared = SharedQueue::new(reach, 8, 9);
    let cq_shared = SharedQueue::new(reach, 8, 6);
    let mut sq = send_queue(&sq_shared, QpType::Rc);
    let mut cq = CompletionQueue::new(cq_shared.queue()).unwrap();
    let (sq_kernel, cq_kernel) = (sq_shared.kernel(), cq_shared.kernel());

    thread::scope(|s| {
        let kernel = s.spawn(move || complete_sends(sq_kernel, cq_kernel, TOTAL, check_nth_wqe));
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
    if reach == Reach::Accessed {
        // One write per WQE, one read per CQE, nothing else but index accesses.
        let (sq_counts, cq_counts) = (sq_shared.region().counts(), cq_shared.region().counts());
        let total_signaled = (0..TOTAL).filter(|&i| is_signaled(i)).count();
        assert_eq!(sq_counts.writes, TOTAL as usize);
        assert_eq!(sq_counts.reads, 0);
        assert_eq!(cq_counts.reads, total_signaled);
        assert_eq!(cq_counts.writes, 0);
    }
}

/// Posts a batch on an accessed queue and checks the access log: per request one Acquire load
/// of the consumer index and one write of the whole WQE into its slot; after all of them, one
/// Release store of the producer index. A provider that published the index before the WQE
/// bytes (or wrote a WQE in pieces) fails here.
#[test]
fn accessed_send_queue_writes_each_wqe_once_before_publishing() {
    let shared = SharedQueue::new(Reach::Accessed, 8, 9);
    let mut sq = send_queue(&shared, QpType::Rc);
    let region = shared.region();
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
    assert_eq!(shared.kernel().send_wqe(0).wr.wr_id.get(), 1);
    assert_eq!(shared.kernel().payload(0, 208, 40), inline);

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

for_both_reaches!(
    rc_send_wqes_carry_every_field,
    ud_sends_name_the_ah_or_carry_the_av,
    refusals_say_how_many_were_posted,
    full_queue_refuses_without_overwriting,
    threaded_kernel_sees_every_request_across_many_wraps,
);

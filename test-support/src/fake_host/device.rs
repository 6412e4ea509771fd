//! The fake host RDMA device: [`FakeDevice`] and its contexts implement the backend's
//! `HostDevice` / `HostContext` on a host without RDMA, keeping every object in a [`World`] the
//! tests inspect and steer (failing the next command, queuing host events).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use vrdma_host::uverbs::{QueryDeviceResp, QueryPortResp};
use vrdma_host::{self as host, *};
use vrdma_spec::attr::qp::QpCaps;
use vrdma_spec::config::{odp_caps, ring_format, OdpCaps};
use vrdma_spec::rxe_v1;
use vrdma_spec::verbs::{
    check_modify_qp, AccessFlags, GidType, MwType, PortState, QpAttrMask, QpState, QpType,
};
use vrdma_spec::wire::{GidEntry, QpAttr};
use vrdma_spec::Le32;
use zerocopy::FromZeros;

pub use super::world::{Connection, World, GID0, PAGE, QUEUE_FILE_SIZE};

type Shared = Arc<Mutex<World>>;

fn world(shared: &Shared) -> MutexGuard<'_, World> {
    shared.lock().unwrap()
}

/// A host RDMA device without RDMA: one active RoCE port with one GID ([`GID0`]), rxe's ring
/// format, and contexts that keep every object in the shared [`World`].
pub struct FakeDevice {
    info: DeviceInfo,
    world: Shared,
}

impl FakeDevice {
    /// A device with nothing created yet.
    pub fn new() -> Arc<FakeDevice> {
        Arc::new(FakeDevice {
            info: DeviceInfo {
                name: "fake0".into(),
                driver: "fake".into(),
                uverbs_path: PathBuf::from("/dev/null"),
                fw_ver: "1.2.3".into(),
                ports: vec![PortInfo {
                    port: 1,
                    state: PortState::Active,
                    link_layer: "Ethernet".into(),
                }],
            },
            world: Shared::default(),
        })
    }

    /// The objects of every context of this device, and the knobs tests turn.
    pub fn world(&self) -> MutexGuard<'_, World> {
        world(&self.world)
    }
}

impl GidSource for FakeDevice {
    fn gid_table(&self, port: u8) -> host::Result<Vec<(u32, GidEntry)>> {
        assert_eq!(port, 1, "the guest's port 1 is host port 1");
        let mut table = vec![(0, GidEntry::valid(GID0, GidType::RoceV2))];
        table.extend(self.world().extra_gids.iter().copied());
        Ok(table)
    }
}

impl HostDevice for FakeDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn ring_format(&self) -> u32 {
        ring_format::RXE_V1
    }

    /// The fake host's own addresses are the entries of its GID table.
    fn delivers_locally(&self, gid: &[u8; 16]) -> host::Result<bool> {
        Ok(self
            .gid_table(1)?
            .iter()
            .any(|(_, entry)| entry.gid == *gid))
    }

    fn netdev_ifindex(&self, _port: u8) -> Option<u32> {
        Some(super::cm::FAKE_NETDEV_IFINDEX)
    }

    fn open_cm(&self) -> host::Result<Option<Box<dyn host::cm::HostCm>>> {
        if !self.world().cm.enabled {
            return Ok(None);
        }
        Ok(Some(Box::new(super::cm::FakeCm::open(&self.world))))
    }

    fn open_context(&self) -> host::Result<Box<dyn HostContext>> {
        Ok(Box::new(FakeContext {
            id: self.world().ownership.open_context(),
            world: Arc::clone(&self.world),
            queue_file: memfd(QUEUE_FILE_SIZE),
            comp: UnixStream::pair().unwrap().0,
            async_fd: UnixStream::pair().unwrap().0,
        }))
    }
}

/// A context of the [`FakeDevice`]: queue buffers come from a memfd of its own (like the
/// uverbs fd, to pass with SHMEM_MAP), and its event fds are sockets that never become readable
/// (tests push events into the [`World`] and call the event handlers themselves).
pub struct FakeContext {
    /// Its number in [`World::ownership`].
    id: u64,
    world: Shared,
    queue_file: File,
    comp: UnixStream,
    async_fd: UnixStream,
}

/// The attributes every fake context reports: generous limits, rxe's vendor id.
/// What rxe's on-demand paging serves (`rxe_init_device_param`): on RC sends, receives,
/// RDMA and atomics, SRQ receives; on UD sends and receives.
pub const RXE_ODP_CAPS: OdpCaps = OdpCaps {
    rc: odp_caps::SEND
        | odp_caps::RECV
        | odp_caps::WRITE
        | odp_caps::READ
        | odp_caps::ATOMIC
        | odp_caps::SRQ_RECV,
    uc: 0,
    ud: odp_caps::SEND | odp_caps::RECV,
};

pub fn device_attr() -> QueryDeviceResp {
    QueryDeviceResp {
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0xffffff,
        max_qp: 1 << 16,
        max_qp_wr: 1 << 14,
        device_cap_flags: 0xffff_ffff,
        max_sge: 32,
        max_sge_rd: 32,
        max_cq: 1 << 16,
        max_cqe: 1 << 15,
        max_mr: 1 << 18,
        max_pd: 1 << 16,
        max_qp_rd_atom: 128,
        max_res_rd_atom: 1 << 16,
        max_qp_init_rd_atom: 128,
        max_ah: 1 << 15,
        max_srq: 1 << 10,
        max_srq_wr: 1 << 14,
        max_srq_sge: 27,
        max_pkeys: 64,
        phys_port_cnt: 1,
        ..Default::default()
    }
}

impl HostContext for FakeContext {
    fn queue_fd(&self) -> BorrowedFd<'_> {
        self.queue_file.as_fd()
    }
    fn cmd_fd(&self) -> BorrowedFd<'_> {
        self.queue_file.as_fd()
    }
    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_fd.as_fd()
    }
    fn comp_channel_fd(&self) -> BorrowedFd<'_> {
        self.comp.as_fd()
    }
    fn num_comp_vectors(&self) -> u32 {
        1
    }
    fn query_device(&self) -> host::Result<QueryDeviceResp> {
        Ok(device_attr())
    }
    fn odp_caps(&self) -> host::Result<Option<OdpCaps>> {
        Ok((!world(&self.world).no_odp).then_some(RXE_ODP_CAPS))
    }
    fn odp_serves_any_iova(&self) -> bool {
        !world(&self.world).odp_at_address_only
    }
    fn query_port(&self, port: u8) -> host::Result<QueryPortResp> {
        assert_eq!(port, 1);
        world(&self.world).port_queries += 1;
        Ok(QueryPortResp {
            state: 4,
            max_mtu: 5,
            active_mtu: 3,
            gid_tbl_len: 16,
            pkey_tbl_len: 1,
            link_layer: 2,
            ..Default::default()
        })
    }
    fn alloc_pd(&self) -> host::Result<PdHandle> {
        let mut w = world(&self.world);
        w.fail("ALLOC_PD")?;
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.pds.insert(h, ());
        Ok(PdHandle(h))
    }
    fn dealloc_pd(&self, pd: PdHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DEALLOC_PD")?;
        w.ownership.check(self.id, "DEALLOC_PD", pd.0);
        w.ownership.forget(pd.0);
        assert!(
            !w.mrs.values().any(|m| m.pd == pd),
            "PD freed while an MR uses it"
        );
        assert!(
            !w.mws.values().any(|(mw_pd, _)| *mw_pd == pd),
            "PD freed while an MW uses it"
        );
        w.pds.remove(&pd.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DEALLOC_PD",
            errno: libc::EINVAL,
        })
    }
    fn reg_mr(&self, init: &MrInit) -> host::Result<Mr> {
        let mut w = world(&self.world);
        w.fail("REG_MR")?;
        if w.no_odp && init.access.contains(AccessFlags::ON_DEMAND) {
            return Err(DeviceError::Command {
                command: "REG_MR",
                errno: libc::EOPNOTSUPP,
            });
        }
        w.ownership.check(self.id, "REG_MR", init.pd.0);
        assert!(w.pds.contains_key(&init.pd.0));
        assert_eq!(init.start % PAGE, init.iova % PAGE, "same in-page offset");
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.mrs.insert(h, *init);
        Ok(Mr {
            handle: MrHandle(h),
            lkey: h << 8,
            rkey: (h << 8) | 1,
        })
    }
    fn dereg_mr(&self, mr: MrHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DEREG_MR")?;
        w.ownership.check(self.id, "DEREG_MR", mr.0);
        w.ownership.forget(mr.0);
        w.mrs.remove(&mr.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DEREG_MR",
            errno: libc::EINVAL,
        })
    }
    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> host::Result<Mw> {
        let mut w = world(&self.world);
        w.fail("ALLOC_MW")?;
        w.ownership.check(self.id, "ALLOC_MW", pd.0);
        assert!(w.pds.contains_key(&pd.0));
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.mws.insert(h, (pd, mw_type));
        // rxe's layout: pool index in the upper 24 bits, an 8-bit key below.
        Ok(Mw {
            handle: MwHandle(h),
            rkey: (h << 8) | 0x42,
        })
    }
    fn dealloc_mw(&self, mw: MwHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DEALLOC_MW")?;
        w.ownership.check(self.id, "DEALLOC_MW", mw.0);
        w.ownership.forget(mw.0);
        w.mws.remove(&mw.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DEALLOC_MW",
            errno: libc::EINVAL,
        })
    }
    fn create_cq(&self, init: &CqInit) -> host::Result<Cq> {
        let mut w = world(&self.world);
        w.fail("CREATE_CQ")?;
        assert!(init.use_comp_channel);
        let slots = (init.cqe + 1).next_power_of_two();
        let buffer = w.buffer(slots, vrdma_spec::rxe_v1::CQE_SIZE)?;
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.cqs.insert(h, init.user_handle);
        w.cq_queues
            .insert(h, (self.queue_file.try_clone().unwrap(), buffer));
        w.cq_geometry.insert(h, ring_geometry(slots, CQE_LOG2_SLOT));
        Ok(Cq {
            handle: CqHandle(h),
            cqe: slots - 1,
            buffer,
        })
    }
    fn destroy_cq(&self, cq: CqHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_CQ")?;
        w.ownership.check(self.id, "DESTROY_CQ", cq.0);
        w.ownership.forget(cq.0);
        w.cq_pending.remove(&cq.0);
        w.cq_queues.remove(&cq.0);
        w.cq_geometry.remove(&cq.0);
        w.cqs.remove(&cq.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_CQ",
            errno: libc::EINVAL,
        })
    }
    fn resize_cq(&self, cq: CqHandle, cqe: u32) -> host::Result<CqResize> {
        let mut w = world(&self.world);
        w.fail("RESIZE_CQ")?;
        w.ownership.check(self.id, "RESIZE_CQ", cq.0);
        let einval = DeviceError::Command {
            command: "RESIZE_CQ",
            errno: libc::EINVAL,
        };
        if !w.cqs.contains_key(&cq.0) {
            return Err(einval);
        }
        let pending = w.cq_pending.get(&cq.0).copied().unwrap_or(0);
        if cqe < pending || cqe > device_attr().max_cqe {
            return Err(einval);
        }
        let slots = (cqe + 1).next_power_of_two();
        let buffer = w.buffer(slots, vrdma_spec::rxe_v1::CQE_SIZE)?;
        // As rxe_queue_resize: what the old buffer holds moves to the new one's first slots.
        let held = w.completions_held(cq.0);
        if held.len() > (slots - 1) as usize {
            return Err(einval);
        }
        w.resized.push((cq.0, slots - 1));
        w.cq_queues
            .insert(cq.0, (self.queue_file.try_clone().unwrap(), buffer));
        w.cq_geometry
            .insert(cq.0, ring_geometry(slots, CQE_LOG2_SLOT));
        for slot in &held {
            w.post_completion(cq.0, slot);
        }
        Ok(CqResize {
            cqe: slots - 1,
            buffer,
        })
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> host::Result<()> {
        let mut w = world(&self.world);
        w.ownership.check(self.id, "REQ_NOTIFY_CQ", cq.0);
        w.armed.push((cq.0, solicited_only));
        Ok(())
    }
    fn create_qp(&self, init: &QpInit) -> host::Result<Qp> {
        let mut w = world(&self.world);
        w.fail("CREATE_QP")?;
        w.ownership.check(self.id, "CREATE_QP", init.pd.0);
        w.ownership.check(self.id, "CREATE_QP", init.send_cq.0);
        w.ownership.check(self.id, "CREATE_QP", init.recv_cq.0);
        if let Some(srq) = init.srq {
            w.ownership.check(self.id, "CREATE_QP", srq.0);
        }
        let c = init.caps;
        let send_slots = (c.max_send_wr + 1).next_power_of_two();
        let wqe = (c.max_send_sge * 16).max(c.max_inline_data);
        let sq = w.buffer(send_slots, rxe_v1::send_wqe_size(wqe / 16, wqe))?;
        let (rq, max_recv_wr) = match init.srq {
            Some(_) => (None, 0),
            None => {
                let slots = (c.max_recv_wr + 1).next_power_of_two();
                (
                    Some(w.buffer(slots, rxe_v1::recv_wqe_size(c.max_recv_sge))?),
                    slots - 1,
                )
            }
        };
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        let qpn = 0x100 + h;
        w.qps.insert(h, (qpn, init.user_handle));
        w.qp_state.insert(h, QpState::Reset);
        w.qp_types.insert(h, init.qp_type);
        w.send_queues
            .insert(h, (self.queue_file.try_clone().unwrap(), sq));
        if let Some(rq) = rq {
            w.recv_queues
                .insert(h, (self.queue_file.try_clone().unwrap(), rq));
        }
        let elem = rxe_v1::send_wqe_size(wqe / 16, wqe)
            .next_power_of_two()
            .max(64);
        w.send_geometry
            .insert(h, ring_geometry(send_slots, elem.trailing_zeros()));
        w.pd_of.insert(h, init.pd.0);
        Ok(Qp {
            handle: QpHandle(h),
            qpn,
            caps: QpCaps {
                max_send_wr: send_slots - 1,
                max_recv_wr,
                max_send_sge: wqe / 16,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: wqe,
            },
            sq,
            rq,
        })
    }
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("MODIFY_QP")?;
        w.ownership.check(self.id, "MODIFY_QP", qp.0);
        let state = attr.qp_state().map_err(|_| DeviceError::Command {
            command: "MODIFY_QP",
            errno: libc::EINVAL,
        })?;
        // The kernel's own check (`ib_modify_qp_is_ok`), so that an attribute the device let
        // through for the wrong QP type shows up as a host failure.
        if let (Some(&qp_type), Some(&cur)) = (w.qp_types.get(&qp.0), w.qp_state.get(&qp.0)) {
            let next = if mask.contains(QpAttrMask::STATE) {
                state
            } else {
                cur
            };
            let claimed = mask.contains(QpAttrMask::CUR_STATE).then_some(cur);
            check_modify_qp(qp_type, cur, mask, next, claimed).map_err(|_| {
                DeviceError::Command {
                    command: "MODIFY_QP",
                    errno: libc::EINVAL,
                }
            })?;
        }
        if mask.contains(QpAttrMask::STATE) {
            w.qp_state.insert(qp.0, state);
        }
        let paths = w.qp_paths.entry(qp.0).or_default();
        if mask.contains(QpAttrMask::AV) {
            paths.0 = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            paths.1 = attr.alt_ah_attr;
        }
        let (primary, alternate) = *paths;
        for (bit, path) in [(QpAttrMask::AV, primary), (QpAttrMask::ALT_PATH, alternate)] {
            if mask.contains(bit) {
                w.paths_given.push((self.id, path));
            }
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            w.qp_dest.insert(qp.0, attr.dest_qp_num.get());
        }
        let depths = w.qp_rd_atomic.entry(qp.0).or_default();
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            depths.0 = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            depths.1 = attr.max_dest_rd_atomic;
        }
        let connected = matches!(w.qp_types.get(&qp.0), Some(QpType::Rc | QpType::Uc));
        if connected
            && mask.intersects(QpAttrMask::AV | QpAttrMask::DEST_QPN | QpAttrMask::ALT_PATH)
        {
            let connection = Connection {
                context: self.id,
                qp: qp.0,
                dgids: [primary.dgid, alternate.dgid],
                dest_qpn: w.qp_dest.get(&qp.0).copied().unwrap_or(0),
            };
            w.connections.push(connection);
        }
        w.modified.push((qp.0, mask, state));
        Ok(())
    }
    fn query_qp(&self, qp: QpHandle, _mask: QpAttrMask) -> host::Result<QpInfo> {
        let mut w = world(&self.world);
        w.ownership.check(self.id, "QUERY_QP", qp.0);
        let state = *w.qp_state.get(&qp.0).ok_or(DeviceError::Command {
            command: "QUERY_QP",
            errno: libc::EINVAL,
        })?;
        let caps = QpCaps {
            max_send_wr: 15,
            ..Default::default()
        };
        let mut attr = QpAttr::new_zeroed()
            .with_qp_state(state)
            .with_port_num(1)
            .with_caps(caps);
        if let Some((primary, alternate)) = w.qp_paths.get(&qp.0) {
            attr.ah_attr = *primary;
            attr.alt_ah_attr = *alternate;
        }
        attr.dest_qp_num = Le32::new(w.qp_dest.get(&qp.0).copied().unwrap_or(0));
        let (initiator, responder) = w.qp_rd_atomic.get(&qp.0).copied().unwrap_or_default();
        attr.max_rd_atomic = initiator;
        attr.max_dest_rd_atomic = responder;
        Ok(QpInfo {
            attr,
            sq_sig_all: false,
        })
    }
    fn destroy_qp(&self, qp: QpHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_QP")?;
        w.ownership.check(self.id, "DESTROY_QP", qp.0);
        w.ownership.forget(qp.0);
        w.qp_state.remove(&qp.0);
        w.qp_rd_atomic.remove(&qp.0);
        w.qp_types.remove(&qp.0);
        w.send_queues.remove(&qp.0);
        w.recv_queues.remove(&qp.0);
        w.send_geometry.remove(&qp.0);
        w.pd_of.remove(&qp.0);
        w.qp_paths.remove(&qp.0);
        w.qp_dest.remove(&qp.0);
        w.qps.remove(&qp.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_QP",
            errno: libc::EINVAL,
        })
    }
    fn create_srq(&self, init: &SrqInit) -> host::Result<Srq> {
        let mut w = world(&self.world);
        w.fail("CREATE_SRQ")?;
        w.ownership.check(self.id, "CREATE_SRQ", init.pd.0);
        let slots = (init.max_wr + 1).next_power_of_two();
        let buffer = w.buffer(slots, rxe_v1::recv_wqe_size(init.max_sge))?;
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.srqs.insert(h, init.user_handle);
        w.srq_max_sge.insert(h, init.max_sge);
        Ok(Srq {
            handle: SrqHandle(h),
            max_wr: slots - 1,
            max_sge: init.max_sge,
            srq_num: 0x200 + h,
            buffer,
        })
    }
    fn modify_srq(&self, srq: SrqHandle, m: &SrqModify) -> host::Result<Option<QueueBuffer>> {
        let mut w = world(&self.world);
        w.fail("MODIFY_SRQ")?;
        w.ownership.check(self.id, "MODIFY_SRQ", srq.0);
        let Some(max_wr) = m.max_wr else {
            return Ok(None);
        };
        let pending = w.srq_pending.get(&srq.0).copied().unwrap_or(0);
        let max_sge = w.srq_max_sge.get(&srq.0).copied();
        let (Some(max_sge), true) = (max_sge, max_wr >= pending) else {
            return Err(DeviceError::Command {
                command: "MODIFY_SRQ",
                errno: libc::EINVAL,
            });
        };
        // As rxe_queue_resize: a new buffer of the new geometry.
        let slots = (max_wr + 1).next_power_of_two();
        let buffer = w.buffer(slots, rxe_v1::recv_wqe_size(max_sge))?;
        w.srq_resized.push((srq.0, slots - 1));
        Ok(Some(buffer))
    }
    fn destroy_srq(&self, srq: SrqHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.fail("DESTROY_SRQ")?;
        w.ownership.check(self.id, "DESTROY_SRQ", srq.0);
        w.ownership.forget(srq.0);
        w.srq_max_sge.remove(&srq.0);
        w.srq_pending.remove(&srq.0);
        w.srqs
            .remove(&srq.0)
            .map(|_| ())
            .ok_or(DeviceError::Command {
                command: "DESTROY_SRQ",
                errno: libc::EINVAL,
            })
    }
    fn create_ah(&self, init: &AhInit) -> host::Result<Ah> {
        let mut w = world(&self.world);
        w.fail("CREATE_AH")?;
        w.ownership.check(self.id, "CREATE_AH", init.pd.0);
        assert_eq!(init.attr.port_num, 1);
        let h = w.handle();
        w.ownership.adopt(self.id, h);
        w.ahs.insert(h, ());
        w.ah_attrs.insert(h, init.attr);
        w.pd_of.insert(h, init.pd.0);
        w.paths_given.push((self.id, init.attr));
        Ok(Ah {
            handle: AhHandle(h),
            ah_num: h,
        })
    }
    fn destroy_ah(&self, ah: AhHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.ah_attrs.remove(&ah.0);
        w.pd_of.remove(&ah.0);
        w.ownership.check(self.id, "DESTROY_AH", ah.0);
        w.ownership.forget(ah.0);
        w.ahs.remove(&ah.0).map(|_| ()).ok_or(DeviceError::Command {
            command: "DESTROY_AH",
            errno: libc::EINVAL,
        })
    }
    fn kick_send(&self, qp: QpHandle) -> host::Result<()> {
        let mut w = world(&self.world);
        w.ownership.check(self.id, "POST_SEND", qp.0);
        w.kicks.push(qp.0);
        Ok(())
    }
    fn read_async_event(&self) -> host::Result<Option<AsyncEvent>> {
        Ok(world(&self.world).async_events.pop_front())
    }
    fn read_comp_event(&self) -> host::Result<Option<CompEvent>> {
        Ok(world(&self.world).comp_events.pop_front())
    }
}

/// log2 of the slot stride of the fake's CQ buffers (rxe's: a CQE rounded up to a power of
/// two).
/// The geometry of a buffer the fake made (always a valid rxe v1 ring: a bug otherwise).
fn ring_geometry(num_slots: u32, log2_slot_size: u32) -> rxe_v1::RingGeometry {
    rxe_v1::RingGeometry::new(num_slots, log2_slot_size).expect("the fake host makes rxe v1 rings")
}

const CQE_LOG2_SLOT: u32 = vrdma_spec::rxe_v1::CQE_SIZE
    .next_power_of_two()
    .trailing_zeros();

/// An anonymous memory file of `size` bytes (guest RAM, or a fake context's queue buffers).
pub fn memfd(size: u64) -> File {
    // SAFETY: memfd_create only reads the NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"vrdma-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: memfd_create just returned this fd and nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size).unwrap();
    file
}
